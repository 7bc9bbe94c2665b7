#!/usr/bin/env python3
"""A shape-real Qwen2-VL-2B, Qwen2.5-VL-3B or Qwen3-VL-2B checkpoint: the real model's dimensions, random
weights, Hugging Face layout.

Every system under comparison loads the same bytes: config.json, sharded safetensors with their index,
tokenizer.json (a small byte-level BPE whose special tokens sit at the real Qwen-VL ids, and whose vocab is
padded with filler tokens so every id up to 151642 decodes to text), tokenizer_config.json, the family's
chat template, processor_config.json and generation_config.json (greedy, eos 151645 and 151643).

--family picks the real model:

  qwen2_vl    (default) Qwen2-VL-2B-Instruct: 28 text layers of width 1536, 32 vision blocks; config.json as
              transformers 5 writes it (text fields under text_config). Directory qwen2vl-2b-<dtype>-L<n>-V<m>.
  qwen2_5_vl  Qwen2.5-VL-3B-Instruct: 36 text layers of width 2048, 32 windowed vision blocks of width 1280;
              config.json in the Hub's form (text fields flat beside vision_config, rope_theta and a legacy
              rope_scaling of type mrope, torch_dtype, the vision tower's in_chans and spatial_patch_size),
              processor_class Qwen2_5_VLProcessor. The two families share the special ids, so the tokenizer and
              chat template are the same. Its vision tower attends over the whole image in every 8th block
              (fullatt_block_indexes 7, 15, 23, 31 of 32) and within windows elsewhere; a reduced tower keeps
              that rhythm (the blocks i with i % 8 == 7 below --vision-blocks, or only the last block when there
              are fewer than 8). Directory qwen2_5_vl-3b-<dtype>-L<n>-V<m>.
  qwen3_vl    Qwen3-VL-2B-Instruct: 28 text layers of width 2048 (16 heads of 128, 8 KV heads, q/k RMS norms,
              interleaved M-RoPE sections 24, 20, 20, rope_theta 5e6), 24 vision blocks of width 1024 (patch 16,
              learned 48x48 position grid) with DeepStack mergers after blocks 5, 11 and 17 feeding text layers
              0, 1 and 2; tied embeddings. config.json in the Hub's form (transformers 4.57 wrote it: text
              fields nested under text_config with rope_theta and a rope_scaling of type default, the vision
              config under the old model_type qwen3_vl, torch_dtype), processor_class Qwen3VLProcessor (image
              mean and std 0.5, pixels 65536 to 16777216 per image). A reduced tower keeps the real DeepStack
              blocks below --vision-blocks, at most --text-layers of them (each feeds one of the first text
              layers); when none is left it uses block 0 alone, so the mergers and the injection still run.
              The special ids, and so the tokenizer, are the other two families'; the chat template is
              Qwen3-VL's without its tool-calling parts: unlike Qwen2-VL's it adds no default system prompt, and
              it renders an image as <|vision_start|><|image_pad|><|vision_end|> as Qwen2-VL's does. Directory
              qwen3_vl-2b-<dtype>-L<n>-V<m>.

Run with the oracle venv's python (torch, transformers 5.24):

    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/gen_ckpt.py                      # 28 text / 32 vision, bf16
    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/gen_ckpt.py --dtype f32 --text-layers 8 --vision-blocks 8
    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/gen_ckpt.py --family qwen2_5_vl    # 36 text / 32 vision, bf16
    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/gen_ckpt.py --family qwen3_vl      # 28 text / 24 vision, bf16
    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/gen_ckpt.py --family qwen3_vl --dtype f32 --text-layers 2 --vision-blocks 2

Prints the checkpoint directory (default under ~/.cache/mlxcel/bench/); an existing complete directory is
kept unless --force. Weights: seed 1235, matrices N(0, 1/fan_in), vectors default + N(0, 0.1) (the oracle's
scheme), drawn in f32 and then cast, so the bf16 and f32 checkpoints of one depth hold the same values up to
rounding. The whole f32 model is held in memory while it is drawn: about 4 bytes a parameter (8.8 GB for
Qwen2-VL-2B, 15 GB for Qwen2.5-VL-3B, 8.5 GB for Qwen3-VL-2B at full depth, whichever --dtype is stored).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "oracle"))

BENCH_DIR = Path(os.environ.get("MLXCEL_BENCH_DIR", Path.home() / ".cache" / "mlxcel" / "bench"))
DONE = "bench-checkpoint.json"

# The real Qwen2-VL special tokens and their ids.
SPECIALS = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|object_ref_start|>": 151646,
    "<|object_ref_end|>": 151647, "<|box_start|>": 151648, "<|box_end|>": 151649, "<|quad_start|>": 151650,
    "<|quad_end|>": 151651, "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655, "<|video_pad|>": 151656,
}
VOCAB = 151936  # embedding rows of the real model (ids past the last special are padding rows)

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
# Each family's real model: the directory name's stem and its full depth (text layers, vision blocks).
MODEL_NAME = {"qwen2_vl": "qwen2vl-2b", "qwen2_5_vl": "qwen2_5_vl-3b", "qwen3_vl": "qwen3_vl-2b"}
FULL_DEPTH = {"qwen2_vl": (28, 32), "qwen2_5_vl": (36, 32), "qwen3_vl": (28, 24)}
# Qwen3-VL-2B-Instruct's DeepStack blocks (vision_config.deepstack_visual_indexes) of its 24.
QWEN3_VL_DEEPSTACK = (5, 11, 17)

# Qwen2-VL-2B-Instruct's chat template (default system prompt, image and video placeholders).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen3-VL-2B-Instruct's chat template without its tool-calling parts (tool definitions, tool calls, tool
# responses): a system message only when the conversation opens with one (no default system prompt, unlike
# Qwen2-VL's), system messages further on dropped as the real one drops them, images and videos rendered as
# Qwen2-VL's template renders them, an assistant message's text parts only.
QWEN3_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% if messages[0]['role'] == 'system' %}<|im_start|>system\n{% if messages[0]['content'] is string %}"
    "{{ messages[0]['content'] }}{% else %}{% for content in messages[0]['content'] %}{% if 'text' in content %}"
    "{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}{% if message['role'] == 'user' %}<|im_start|>user\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% elif message['role'] == 'assistant' %}<|im_start|>assistant\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for content in message['content'] %}{% if 'text' in content %}"
    "{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHAT_TEMPLATES = {"qwen2_vl": CHAT_TEMPLATE, "qwen2_5_vl": CHAT_TEMPLATE, "qwen3_vl": QWEN3_VL_CHAT_TEMPLATE}


def default_dir(dtype: str, text_layers: int, vision_blocks: int, family: str = "qwen2_vl") -> Path:
    return BENCH_DIR / f"{MODEL_NAME[family]}-{dtype}-L{text_layers}-V{vision_blocks}"


def config(text_layers: int, vision_blocks: int):
    from transformers import Qwen2VLConfig

    eot, im_end = SPECIALS["<|endoftext|>"], SPECIALS["<|im_end|>"]
    return Qwen2VLConfig(
        text_config=dict(
            vocab_size=VOCAB, hidden_size=1536, intermediate_size=8960, num_hidden_layers=text_layers,
            num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
            hidden_act="silu", sliding_window=32768, use_sliding_window=False, max_window_layers=28,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
            bos_token_id=eot, eos_token_id=im_end, pad_token_id=eot, tie_word_embeddings=True,
        ),
        vision_config=dict(
            depth=vision_blocks, embed_dim=1280, hidden_size=1536, hidden_act="quick_gelu", mlp_ratio=4,
            num_heads=16, in_channels=3, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
        ),
        image_token_id=SPECIALS["<|image_pad|>"], video_token_id=SPECIALS["<|video_pad|>"],
        vision_start_token_id=SPECIALS["<|vision_start|>"], vision_end_token_id=SPECIALS["<|vision_end|>"],
        tie_word_embeddings=True,
    )


def fullatt_blocks(depth: int) -> list[int]:
    """Qwen2.5-VL's full-attention blocks for a tower of `depth`: every 8th, as in the real 32-block tower
    (7, 15, 23, 31); a tower shallower than 8 keeps its last block full, so a reduced tower still runs both
    kinds of block (from depth 2 on) and the index list stays valid (every index below depth)."""
    return [i for i in range(depth) if i % 8 == 7] or [depth - 1]


def qwen2_5_vl_hub_config(text_layers: int, vision_blocks: int, dtype: str) -> dict:
    """Qwen2.5-VL-3B-Instruct's config.json as the Hub has it, at the given depth, naming the stored dtype.
    The Hub form, not the nested one transformers 5 writes, because it is what users download; the host and
    transformers read both. `vision_token_id` (<|vision_pad|>) is in the Hub's file; neither reads it."""
    eot, im_end = SPECIALS["<|endoftext|>"], SPECIALS["<|im_end|>"]
    return {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
        "attention_dropout": 0.0, "bos_token_id": eot, "eos_token_id": im_end,
        "vision_start_token_id": SPECIALS["<|vision_start|>"], "vision_end_token_id": SPECIALS["<|vision_end|>"],
        "vision_token_id": SPECIALS["<|vision_pad|>"], "image_token_id": SPECIALS["<|image_pad|>"],
        "video_token_id": SPECIALS["<|video_pad|>"],
        "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 11008,
        "max_position_embeddings": 128000, "max_window_layers": 70, "num_attention_heads": 16,
        "num_hidden_layers": text_layers, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "sliding_window": 32768, "tie_word_embeddings": True,
        "torch_dtype": {"f32": "float32", "bf16": "bfloat16"}[dtype], "use_cache": True, "use_sliding_window": False,
        "vision_config": {
            "depth": vision_blocks, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
            "num_heads": 16, "in_chans": 3, "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2,
            "spatial_patch_size": 14, "window_size": 112, "fullatt_block_indexes": fullatt_blocks(vision_blocks),
            "tokens_per_second": 2, "temporal_patch_size": 2,
        },
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": VOCAB,
    }


def deepstack_blocks(text_layers: int, vision_blocks: int) -> list[int]:
    """Qwen3-VL-2B's DeepStack blocks (5, 11, 17) for a reduced model: those below `vision_blocks`, at most
    `text_layers` of them (the i-th feeds text layer i; transformers would drop the rest unused), or block 0
    alone when none is left, so a reduced model still runs the DeepStack mergers and their injection and the
    index list stays valid (increasing, every index below depth)."""
    return [i for i in QWEN3_VL_DEEPSTACK if i < vision_blocks][:text_layers] or [0]


def qwen3_vl_hub_config(text_layers: int, vision_blocks: int, dtype: str) -> dict:
    """Qwen3-VL-2B-Instruct's config.json as the Hub has it (written by transformers 4.57: the text fields
    nested, rope_theta beside a rope_scaling of type default holding the interleaved sections, the vision config
    under the old model_type qwen3_vl that transformers 5 reads as qwen3_vl_vision), at the given depth, naming
    the stored dtype. The top-level tie_word_embeddings is the one transformers 5 ties by (Qwen3VLConfig's own
    default is false); the text config's copy is the Hub file's, read by mlx-vlm."""
    eot, im_end = SPECIALS["<|endoftext|>"], SPECIALS["<|im_end|>"]
    name = {"f32": "float32", "bf16": "bfloat16"}[dtype]
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
        "image_token_id": SPECIALS["<|image_pad|>"], "video_token_id": SPECIALS["<|video_pad|>"],
        "vision_start_token_id": SPECIALS["<|vision_start|>"], "vision_end_token_id": SPECIALS["<|vision_end|>"],
        "tie_word_embeddings": True, "torch_dtype": name,
        "text_config": {
            "model_type": "qwen3_vl_text", "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": eot, "eos_token_id": im_end, "dtype": name, "head_dim": 128, "hidden_act": "silu",
            "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
            "max_position_embeddings": 262144, "num_attention_heads": 16, "num_hidden_layers": text_layers,
            "num_key_value_heads": 8, "rms_norm_eps": 1e-6,
            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
            "rope_theta": 5000000, "tie_word_embeddings": True, "use_cache": True, "vocab_size": VOCAB,
        },
        "vision_config": {
            "model_type": "qwen3_vl", "deepstack_visual_indexes": deepstack_blocks(text_layers, vision_blocks),
            "depth": vision_blocks, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1024, "in_channels": 3,
            "initializer_range": 0.02, "intermediate_size": 4096, "num_heads": 16, "num_position_embeddings": 2304,
            "out_hidden_size": 2048, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
        },
    }


# The families whose config.json is written in the Hub's form: its maker, and the names of the transformers
# config and model classes built from it.
HUB_CONFIGS = {"qwen2_5_vl": (qwen2_5_vl_hub_config, "Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration"),
               "qwen3_vl": (qwen3_vl_hub_config, "Qwen3VLConfig", "Qwen3VLForConditionalGeneration")}


def tokenizer(chat_template: str = CHAT_TEMPLATE):
    """The oracle's byte-level BPE (384 trained pieces), filler pieces up to id 151642, the specials at their
    real ids. Fillers are never produced by encoding (no merges lead to them) but decode to ` #<id in base
    36>`, so generated ids stream as text as they would with the real vocab."""
    import common
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(common.build_tokenizer([]).to_str())
    vocab = spec["model"]["vocab"]
    base = len(vocab)
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"

    def b36(n: int) -> str:
        s = ""
        while True:
            n, r = divmod(n, 36)
            s = digits[r] + s
            if n == 0:
                return s

    first_special = min(SPECIALS.values())
    for i in range(base, first_special):
        piece = "Ġ#" + b36(i)  # "Ġ" is the byte-level form of a space
        if piece in vocab:
            raise RuntimeError(f"filler {piece} collides with a trained piece")
        vocab[piece] = i
    template = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
    spec["added_tokens"] = [dict(template, id=i, content=t) for t, i in SPECIALS.items()]
    for t, i in SPECIALS.items():
        vocab[t] = i
    tok = Tokenizer.from_str(json.dumps(spec))
    for t, i in SPECIALS.items():
        assert tok.token_to_id(t) == i, t
    probe = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe this image.<|im_end|>\n"
    assert tok.decode(tok.encode(probe).ids, skip_special_tokens=False) == probe
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    hf.chat_template = chat_template
    return hf


def processor(tok, family: str = "qwen2_vl"):
    import transformers
    from transformers import Qwen2VLImageProcessorPil, Qwen2VLVideoProcessor, Qwen3VLVideoProcessor

    if family == "qwen3_vl":
        # Qwen3-VL-2B-Instruct's: Qwen2-VL's image processor at patch 16 with mean and std 0.5 and its pixel
        # limits; its video processor's limits (the host serves no video; transformers saves them).
        half = [0.5, 0.5, 0.5]
        image = Qwen2VLImageProcessorPil(size={"shortest_edge": 65536, "longest_edge": 16777216}, patch_size=16,
                                         temporal_patch_size=2, merge_size=2, image_mean=half, image_std=half)
        video = Qwen3VLVideoProcessor(size={"shortest_edge": 4096, "longest_edge": 25165824}, patch_size=16,
                                      temporal_patch_size=2, merge_size=2, image_mean=half, image_std=half)
    else:
        # Qwen2-VL-2B-Instruct's pixel limits, which Qwen2.5-VL-3B-Instruct keeps; Qwen2.5-VL's processor wraps
        # Qwen2-VL's image and video processors.
        image = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 16384, patch_size=14,
                                         temporal_patch_size=2, merge_size=2)
        video = Qwen2VLVideoProcessor(patch_size=14, temporal_patch_size=2, merge_size=2)
    cls = getattr(transformers, {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor",
                                 "qwen3_vl": "Qwen3VLProcessor"}[family])
    return cls(image_processor=image, tokenizer=tok, video_processor=video, chat_template=CHAT_TEMPLATES[family])


def build(out: Path, dtype: str, text_layers: int, vision_blocks: int, shard: str, family: str = "qwen2_vl") -> dict:
    import common
    import torch
    import transformers
    from transformers import GenerationConfig, Qwen2VLForConditionalGeneration

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    timings = {}
    t = time.perf_counter()
    torch.manual_seed(common.SEED)
    hub = None
    if family in HUB_CONFIGS:
        # Built from the Hub form itself (as from_pretrained reads it), so the weights fit the config.json
        # written below.
        make, config_cls, model_cls = HUB_CONFIGS[family]
        hub = make(text_layers, vision_blocks, dtype)
        # A copy: from_dict rewrites what it is given in place into transformers 5's form (the rope fields,
        # Qwen3-VL's vision model_type).
        cfg = getattr(transformers, config_cls).from_dict(json.loads(json.dumps(hub)))
        model = getattr(transformers, model_cls)._from_config(cfg, dtype=torch.float32)
    else:
        model = Qwen2VLForConditionalGeneration._from_config(config(text_layers, vision_blocks), dtype=torch.float32)
    timings["construct_s"] = time.perf_counter() - t
    t = time.perf_counter()
    common.randomize(model)  # seed SEED + 1 = 1235
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
        # The stored dtype, named as the Hub's checkpoints name it (the family plugins read their
        # encoder weights in the dtype the config says).
        for cfg in [model.config] + [getattr(model.config, k) for k in model.config.sub_configs]:
            cfg.dtype = "bfloat16"
    timings["fill_s"] = time.perf_counter() - t
    assert model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr(), "not tied"
    eot, im_end = SPECIALS["<|endoftext|>"], SPECIALS["<|im_end|>"]
    model.generation_config = GenerationConfig(bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot,
                                               do_sample=False)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    t = time.perf_counter()
    model.save_pretrained(tmp, max_shard_size=shard)
    processor(tokenizer(CHAT_TEMPLATES[family]), family).save_pretrained(tmp)
    if hub is not None:
        (tmp / "config.json").write_text(json.dumps(hub, indent=2) + "\n")
        check_reads_back(tmp, model.config)
    timings["save_s"] = time.perf_counter() - t
    params = {
        "total": sum(p.numel() for p in model.parameters()),
        "text": sum(p.numel() for n, p in model.named_parameters() if "language_model" in n),
        "vision": sum(p.numel() for n, p in model.named_parameters() if ".visual." in n or n.startswith("visual")),
    }
    files = {f.name: f.stat().st_size for f in sorted(tmp.iterdir())}
    info = {
        "generator": "tools/bench/gen_ckpt.py", "family": family, "dtype": dtype, "text_layers": text_layers,
        "vision_blocks": vision_blocks, "params": params, "bytes": sum(files.values()), "files": files,
        "seed": common.SEED, "timings_s": {k: round(v, 1) for k, v in timings.items()},
    }
    (tmp / DONE).write_text(json.dumps(info, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return info


def check_reads_back(ckpt: Path, want) -> None:
    """transformers must read the written Hub-form config.json to the config the weights were drawn for."""
    from transformers import AutoConfig

    got = AutoConfig.from_pretrained(ckpt)
    # Bookkeeping that differs between a config built in memory and one read from a directory.
    skip = {"dtype", "_name_or_path", "transformers_version", "architectures"}
    for sub in ("text_config", "vision_config"):
        a = {k: v for k, v in getattr(got, sub).to_dict().items() if k not in skip}
        b = {k: v for k, v in getattr(want, sub).to_dict().items() if k not in skip}
        if a != b:
            diff = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
            raise RuntimeError(f"{ckpt}/config.json reads back to another {sub}: {diff}")
    if got.tie_word_embeddings != want.tie_word_embeddings:
        raise RuntimeError(f"{ckpt}/config.json: tie_word_embeddings reads back as {got.tie_word_embeddings}")


def ensure(dtype: str = "bf16", text_layers: int | None = None, vision_blocks: int | None = None,
           out: Path | None = None, force: bool = False, shard: str = "2GB", family: str = "qwen2_vl") -> Path:
    """The checkpoint directory, built unless a complete one is there. Depths default to the real model's."""
    full_text, full_vision = FULL_DEPTH[family]
    text_layers = full_text if text_layers is None else text_layers
    vision_blocks = full_vision if vision_blocks is None else vision_blocks
    if text_layers < 1 or vision_blocks < 1:
        raise ValueError("gen_ckpt: --text-layers and --vision-blocks must be at least 1")
    out = out or default_dir(dtype, text_layers, vision_blocks, family)
    if force or not (out / DONE).exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        print(f"gen_ckpt: building {out}", file=sys.stderr, flush=True)
        info = build(out, dtype, text_layers, vision_blocks, shard, family)
        print(f"gen_ckpt: {info['bytes'] / 1e9:.2f} GB, {info['params']['total']:,} parameters, "
              f"{info['timings_s']}", file=sys.stderr, flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=FAMILIES, default="qwen2_vl",
                    help="qwen2_vl: Qwen2-VL-2B's shape; qwen2_5_vl: Qwen2.5-VL-3B's; qwen3_vl: Qwen3-VL-2B's "
                         "(default %(default)s)")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--text-layers", type=int,
                    help="default: the real model's (28 qwen2_vl, 36 qwen2_5_vl, 28 qwen3_vl)")
    ap.add_argument("--vision-blocks", type=int, help="default: the real model's (32; 24 qwen3_vl)")
    ap.add_argument("--out", type=Path, help="default: ~/.cache/mlxcel/bench/qwen2vl-2b-<dtype>-L<n>-V<m> "
                                             "(qwen2_5_vl-3b-... and qwen3_vl-2b-... for the other families)")
    ap.add_argument("--shard-size", default="2GB", help="max_shard_size for save_pretrained")
    ap.add_argument("--force", action="store_true", help="rebuild even when a complete checkpoint is there")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(ensure(args.dtype, args.text_layers, args.vision_blocks, args.out, args.force, args.shard_size,
                 args.family))
    return 0


if __name__ == "__main__":
    sys.exit(main())
