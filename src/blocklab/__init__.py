"""blocklab: re-run the transformer-block experiments of two textbook chapters and regenerate their figures."""
from .config import ConfigError, ModelConfig
from .model.blocks import DecoderBlock, DecoderOnlyBlock, EncoderBlock, PostNormResidual, PreNormResidual
from .model.models import DecoderLM, EncoderDecoder

__version__ = "0.1.0"
__all__ = [
    "ConfigError",
    "DecoderBlock",
    "DecoderLM",
    "DecoderOnlyBlock",
    "EncoderBlock",
    "EncoderDecoder",
    "ModelConfig",
    "PostNormResidual",
    "PreNormResidual",
]
