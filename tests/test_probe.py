"""The residual probe against hidden states computed directly (transformers' own forward, our DecoderLM's stream)."""
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from safetensors.torch import save_file

from blocklab import ConfigError, DecoderLM, ModelConfig
from blocklab.integrity import run_record, seal_meta
from blocklab.cli import main
from blocklab.experiments.residual_trained import (
    capture_stream, decoder_layers, load_causal_lm, load_gguf_once, measure_residual, probe_copy_run, prompt_ids,
    stream_stats,
)

REPO = Path(__file__).resolve().parents[1]
WORDS = ["[UNK]", "a", "transformer", "block", "wraps", "attention", "and", "an", "mlp", "in", "layer"]


def reference_stats(hidden: list[np.ndarray]) -> pd.DataFrame:
    """The same statistics written out with numpy, one sequence at a time."""
    rows, orthogonal_sq = [], 0.0
    for layer, h in enumerate(hidden):
        tok = np.linalg.norm(h, axis=-1)
        orthogonal_sq = orthogonal_sq + np.linalg.norm(h - (hidden[layer - 1] if layer else 0), axis=-1) ** 2
        row = {"layer": layer, "norm_of_mean": np.mean([np.linalg.norm(s.mean(0)) for s in h]),
               "norm_of_mean_excl_first": np.mean([np.linalg.norm(s[1:].mean(0)) for s in h]),
               "mean_token_norm": tok.mean(), "token_norm_p10": np.percentile(tok, 10),
               "token_norm_p50": np.median(tok), "token_norm_p90": np.percentile(tok, 90), "token_norm_max": tok.max(),
               "orthogonal_ref_token_norm": np.sqrt(orthogonal_sq).mean()}
        if layer:
            prev = hidden[layer - 1]
            ratio = np.linalg.norm(h - prev, axis=-1) / np.linalg.norm(prev, axis=-1)
            cos = ((h - prev) * prev).sum(-1) / (np.linalg.norm(h - prev, axis=-1) * np.linalg.norm(prev, axis=-1))
            row.update(update_ratio_mean=ratio.mean(), update_ratio_p50=np.median(ratio), update_cos_mean=cos.mean())
        rows.append(row)
    return pd.DataFrame(rows)


def assert_matches(ours: pd.DataFrame, ref: pd.DataFrame, rtol=1e-5):
    for column in ref.columns:
        np.testing.assert_allclose(ours[column].to_numpy(float), ref[column].to_numpy(float), rtol=rtol, err_msg=column)


def test_stream_stats_hand_computed():
    """One token: start e1 (length 1); block 1 adds e2 -> sqrt 2, ratio 1, cos 0; block 2 adds 3 e1 -> |(4,1)| = sqrt 17,
    cos(3 e1, e1 + e2) = 1/sqrt 2, while orthogonal updates of the same sizes would give sqrt(1 + 1 + 9)."""
    e1, e2 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    hidden = [e1.view(1, 1, 2), (e1 + e2).view(1, 1, 2), (4 * e1 + e2).view(1, 1, 2)]
    stats = stream_stats(hidden)
    assert stats["norm_of_mean"].tolist() == pytest.approx([1.0, math.sqrt(2), math.sqrt(17)])
    assert stats["update_ratio_mean"].iloc[1:].tolist() == pytest.approx([1.0, 3 / math.sqrt(2)])
    assert math.isnan(stats["update_ratio_mean"].iloc[0])
    assert stats["update_cos_mean"].iloc[1:].tolist() == pytest.approx([0.0, 1 / math.sqrt(2)])
    assert stats["orthogonal_ref_token_norm"].tolist() == pytest.approx([1.0, math.sqrt(2), math.sqrt(11)])
    assert stats["sqrt_ref_norm_of_mean"].tolist() == pytest.approx([1.0, math.sqrt(2), math.sqrt(3)])
    assert stats["depth_fraction"].tolist() == pytest.approx([0.0, 0.5, 1.0])


# ---- a tiny Llama saved the way a Hugging Face checkpoint directory is ---------------------------------------------

@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.5)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    raw = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]").save_pretrained(folder)
    return folder


@torch.no_grad()
def test_tiny_llama_probe_matches_direct_hidden_states(tiny_llama_dir):
    model, tokenizer = load_causal_lm(str(tiny_llama_dir))
    ids = prompt_ids(tokenizer, "a transformer block wraps attention and an mlp in layer")
    assert len(ids) == 10
    stats = measure_residual(model, ids)
    assert len(stats) == model.config.num_hidden_layers + 1

    # Independent reference: transformers' own hidden states with the final norm replaced by the identity, so the
    # last entry is the last block's raw output (RMSNorm forgets scale, so comparing after the norm would prove nothing).
    normed = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    final_norm, model.model.norm = model.model.norm, torch.nn.Identity()
    try:
        raw = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    finally:
        model.model.norm = final_norm
    assert not torch.allclose(raw[-1], normed[-1])  # the reference really differs where the HF tuple is normed
    assert_matches(stats, reference_stats([h.numpy() for h in raw]))


@torch.no_grad()
def test_hooks_see_raw_blocks_not_the_final_norm(tiny_llama_dir):
    model, _ = load_causal_lm(str(tiny_llama_dir))
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    stream = capture_stream(model, ids)
    hidden = model(ids, output_hidden_states=True).hidden_states
    for ours, theirs in zip(stream[:-1], hidden[:-1]):
        torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(model.model.norm(stream[-1]), hidden[-1])
    assert decoder_layers(model) is model.model.layers


# ---- a tiny Llama GGUF, written as llama.cpp writes SmolLM2's ------------------------------------------------------

def _byte_level_alphabet() -> list[str]:
    """GPT-2's 256 byte-level characters (a space is "Ġ")."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(shifted)) for b in range(256)]


@pytest.fixture(scope="module")
def tiny_llama_gguf(tmp_path_factory):
    """2 blocks of width 64, quantized as SmolLM2's file is (Q8_0 embeddings, Q4_1 projections, F32 norms), and a
    byte-level BPE tokenizer with special tokens and a few merges."""
    import gguf

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    merges = ["Ġ t", "Ġt h", "Ġth e", "a t", "Ġ b", "l o", "Ġb lo"]
    tokens = specials + _byte_level_alphabet() + [m.replace(" ", "") for m in merges]
    d, ffn, heads, kv_heads, layers = 64, 128, 4, 2, 2
    path = tmp_path_factory.mktemp("tiny-gguf") / "tiny-llama.Q4_1.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_block_count(layers)
    writer.add_context_length(64)
    writer.add_embedding_length(d)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(specials) + [1] * (len(tokens) - len(specials)))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)

    rng = np.random.default_rng(0)

    def add(name, shape, qtype):
        values = (rng.standard_normal(shape) * 0.3).astype(np.float32)
        if qtype == gguf.GGMLQuantizationType.F32:
            values = 1.0 + values * 0.1  # norm weights near 1
        writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)

    F32, Q4_1, Q8_0 = (gguf.GGMLQuantizationType[t] for t in ("F32", "Q4_1", "Q8_0"))
    add("token_embd.weight", (len(tokens), d), Q8_0)  # tied: no output.weight, as in SmolLM2
    for b in range(layers):
        add(f"blk.{b}.attn_norm.weight", (d,), F32)
        add(f"blk.{b}.attn_q.weight", (d, d), Q4_1)
        add(f"blk.{b}.attn_k.weight", (d * kv_heads // heads, d), Q4_1)
        add(f"blk.{b}.attn_v.weight", (d * kv_heads // heads, d), Q4_1)
        add(f"blk.{b}.attn_output.weight", (d, d), Q4_1)
        add(f"blk.{b}.ffn_norm.weight", (d,), F32)
        add(f"blk.{b}.ffn_gate.weight", (ffn, d), Q4_1)
        add(f"blk.{b}.ffn_up.weight", (ffn, d), Q4_1)
        add(f"blk.{b}.ffn_down.weight", (d, ffn), Q4_1)
    add("output_norm.weight", (d,), F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@torch.no_grad()
def test_gguf_read_once_matches_transformers(tiny_llama_gguf, monkeypatch):
    """load_gguf_once (how SmolLM2 is loaded) against transformers' own AutoTokenizer/AutoModelForCausalLM with
    gguf_file=: the same config, tokenizer, bit-identical weights and stream, with gguf-py parsing the file once and
    building its tensor-name table once. It leans on transformers internals (pinned): this fails if they change."""
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    calls = {"parse": 0, "name_table": 0}
    reader, name_table = gguf.GGUFReader, gguf.get_tensor_name_map

    class CountingReader(reader):
        def __init__(self, *args, **kwargs):
            calls["parse"] += 1
            super().__init__(*args, **kwargs)

    def counting_name_table(*args, **kwargs):
        calls["name_table"] += 1
        return name_table(*args, **kwargs)

    # test-scoped: transformers imports both from gguf when it reads a file
    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    monkeypatch.setattr(gguf, "get_tensor_name_map", counting_name_table)
    model, tokenizer = load_gguf_once(tiny_llama_gguf)
    assert calls == {"parse": 1, "name_table": 1}
    monkeypatch.undo()

    folder, name = tiny_llama_gguf.parent, tiny_llama_gguf.name
    ref_tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    ref = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, local_files_only=True)

    assert type(model) is type(ref) and model.dtype == ref.dtype == torch.float32 and not model.training
    ours, theirs = model.config.to_dict(), ref.config.to_dict()
    theirs.pop("quantization_config")  # transformers records the file it dequantized; nothing reads it
    assert ours == theirs and model.config._attn_implementation == ref.config._attn_implementation
    weights, ref_weights = model.state_dict(), ref.state_dict()
    assert list(weights) == list(ref_weights)
    for key, value in ref_weights.items():
        assert weights[key].dtype == value.dtype and torch.equal(weights[key], value), key
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as in the file

    assert type(tokenizer) is type(ref_tokenizer) and repr(tokenizer) == repr(ref_tokenizer)
    assert tokenizer.backend_tokenizer.to_str() == ref_tokenizer.backend_tokenizer.to_str()
    ids = prompt_ids(tokenizer, "<|im_start|>the blot at the bat")
    assert ids == prompt_ids(ref_tokenizer, "<|im_start|>the blot at the bat") and ids[0] == 1 and len(ids) > 5
    stream, ref_stream = capture_stream(model, torch.tensor([ids])), capture_stream(ref, torch.tensor([ids]))
    assert len(stream) == 3 and all(torch.equal(a, b) for a, b in zip(stream, ref_stream))
    assert not torch.equal(stream[1], stream[2])


def test_missing_path_is_a_config_error(tmp_path):
    missing = tmp_path / "no-such-checkpoint"
    with pytest.raises(ConfigError, match=str(missing)):
        load_causal_lm(str(missing))


def test_unreadable_directory_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=str(tmp_path)):
        load_causal_lm(str(tmp_path))


def write_params(tmp_path, **probe) -> Path:
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    params["probe"].update(probe)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, allow_unicode=True), encoding="utf-8")
    return path


def test_cli_probe_residual_skips_missing_extra_model(tiny_llama_dir, tmp_path, capsys):
    missing = str(tmp_path / "Qwen3-VL-4B")
    params = write_params(tmp_path, model=str(tiny_llama_dir), extra_models=[missing])
    out = tmp_path / "probe" / "lm.csv"
    assert main(["exp", "probe-residual", "--params", str(params), "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert sorted(table["prompt"].unique()) == ["en", "ko"]
    assert set(table["model"]) == {tiny_llama_dir.name}
    assert table.groupby("prompt")["layer"].max().tolist() == [3, 3]
    meta = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    assert [m["status"] for m in meta["models"]] == ["ok", "missing"]
    assert missing in meta["models"][1]["message"]
    assert missing in capsys.readouterr().err


def test_cli_probe_residual_missing_main_model_exits_2(tmp_path, capsys):
    missing = str(tmp_path / "nowhere")
    code = main(["exp", "probe-residual", "--params", str(REPO / "params.yaml"), "--model", missing, "--out", str(tmp_path / "x.csv")])
    assert code == 2
    assert missing in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


# ---- our copy-task models --------------------------------------------------------------------------------------------

TASK = {"vocab_size": 8, "seq_len": 4, "batch_size": 3}


def tiny_run(tmp_path, norm: str, seed: int = 3) -> tuple[Path, ModelConfig, DecoderLM]:
    cfg = ModelConfig(d_model=16, n_heads=2, n_layers=3, vocab_size=TASK["vocab_size"], max_len=2 * TASK["seq_len"],
                      norm_position=norm, position="sinusoidal")
    torch.manual_seed(seed + 100)  # stands in for trained weights: anything but the init of `seed`
    trained = DecoderLM(cfg)
    run = tmp_path / f"{norm}-w0-s{seed}"
    run.mkdir()
    save_file({k: v.contiguous() for k, v in trained.state_dict().items()}, str(run / "model.safetensors"))
    meta = {"run": run.name, "norm": norm, "warmup": 0, "seed": seed, "model_config": cfg.to_dict(), "copy_task": TASK}
    (run / "loss.csv").write_text("step,loss,lr\n1,2.0,0.001\n", encoding="utf-8")  # a finished run has its losses
    # as a finished run's meta.json: its artifacts' checksums and its own (a meta.json without them is refused)
    meta = seal_meta({**meta, **run_record(run, ["loss.csv", "model.safetensors"], 1)})
    (run / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    return run, cfg, trained


@pytest.mark.parametrize("norm", ["pre", "post"])
@torch.no_grad()
def test_copy_probe_init_and_trained_match_direct_forward(tmp_path, norm):
    from blocklab.training.tasks import copy_batch

    run, cfg, trained = tiny_run(tmp_path, norm)
    stats = probe_copy_run(run, batch_seed=7)
    tokens, _ = copy_batch(TASK["batch_size"], TASK["seq_len"], TASK["vocab_size"], torch.Generator().manual_seed(7))
    torch.manual_seed(3)  # the sweep's recipe for a run's initial model
    init = DecoderLM(cfg).eval()
    for state, model in (("init", init), ("trained", trained.eval())):
        _, hidden = model(tokens, return_hidden=True)
        ours = stats[stats["state"] == state].reset_index(drop=True)
        assert len(ours) == cfg.n_layers + 1
        assert_matches(ours, reference_stats([h.numpy() for h in hidden]))
    assert set(stats["norm"]) == {norm} and set(stats["model"]) == {run.name}
    init_norms = stats.loc[stats["state"] == "init", "mean_token_norm"].to_numpy()
    assert not np.allclose(init_norms, stats.loc[stats["state"] == "trained", "mean_token_norm"].to_numpy())


def test_cli_probe_copy(tmp_path):
    runs = [tiny_run(tmp_path, norm)[0] for norm in ("pre", "post")]
    out = tmp_path / "copy.csv"
    assert main(["exp", "probe-copy", "--params", str(REPO / "params.yaml"), "--runs", *map(str, runs), "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert table.groupby(["model", "state"]).size().tolist() == [4, 4, 4, 4]
    assert json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))["runs"] == [str(r) for r in runs]


def test_copy_probe_unfinished_run_is_a_config_error(tmp_path):
    run = tiny_run(tmp_path, "pre")[0]
    (run / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="model.safetensors"):
        probe_copy_run(run)


# ---- the shipped SmolLM2-135M --------------------------------------------------------------------------------------

def test_smollm2_has_30_blocks_and_a_growing_stream(snake_project):
    """The real model as the pipeline's probe_lm rule measured it in the session's tiny DAG (its `probe` section names
    SmolLM2-135M, as params.yaml does): loading it a second time here cost ~30 s of CI for the same numbers. That the
    hooks agree with transformers' own hidden states is tested on a Llama of the same class, saved as a checkpoint
    directory (test_tiny_llama_probe_matches_direct_hidden_states)."""
    lm = pd.read_csv(snake_project / "data/probe/lm.csv")
    assert set(lm["model"]) == {"smollm2-135m"} and set(lm["prompt"]) == {"ko", "en"}
    for _, stats in lm.groupby("prompt"):
        assert stats["layer"].tolist() == list(range(31))  # the embeddings and 30 blocks
        assert np.isfinite(stats.iloc[0].drop([c for c in stats.columns if c.startswith("update_")]).drop(["model", "prompt"]).to_numpy(float)).all()
        assert np.isfinite(stats.iloc[1:].drop(columns=["model", "prompt"]).to_numpy(float)).all()
        median = stats["token_norm_p50"]
        assert median.iloc[-1] > median.iloc[1] > median.iloc[0]


# ---- the figure ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lang", ["ko", "en"])
def test_residual_growth_figure_draws_the_data(lang):
    import matplotlib.pyplot as plt

    from blocklab.figures.residual_trained import residual_growth_figure

    torch.manual_seed(0)
    walk = list(torch.randn(5, 1, 3, 8).cumsum(0))  # a random walk: 4 "blocks" adding random vectors
    lm = pd.concat([stream_stats(walk).assign(model="m", prompt=p) for p in ("ko", "en")])
    copy = pd.concat([stream_stats(walk).assign(model=f"{n}-w0-s0", norm=n, seed=0, state=s)
                      for n in ("pre", "post") for s in ("init", "trained")])
    fig = residual_growth_figure(lm, copy, lang)
    left, right = fig.axes
    assert left.get_yscale() == right.get_yscale() == "log"
    np.testing.assert_allclose(left.lines[0].get_ydata(), [np.linalg.norm(h[0].mean(0)) for h in walk], rtol=1e-6)
    assert any("√(L+1)" in t.get_text() for t in right.get_legend().get_texts())
    assert ("초기화" in [t.get_text() for t in right.get_legend().get_texts()]) == (lang == "ko")
    plt.close(fig)
