"""The lab's outcome of a run (learned, stuck, collapsed ...): defined in ``blocklab.training.outcomes``, below the
lab in the layers (the reviewer reads it too); re-exported here."""
from ..training.outcomes import *  # noqa: F401,F403
