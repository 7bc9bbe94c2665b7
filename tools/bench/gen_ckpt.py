#!/usr/bin/env python3
"""A shape-real Qwen2-VL-2B, Qwen2.5-VL-3B, Qwen3-VL-2B, Molmo2-4B, Molmo-7B-D, Youtu-VL-4B or Gemma 3n E2B checkpoint:
the real model's dimensions, random weights, Hugging Face layout.

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
  molmo2      Molmo2-4B (allenai/Molmo2-4B, the smallest public Molmo2): a Qwen3-4B decoder, 36 layers of width
              2560 (32 heads of 128, 8 KV heads, per-head q/k RMS norms, rope_theta 5e6, intermediate 9728), its
              embedding the 151936-row base vocabulary plus 128 additional rows (the image tokens), an untied LM
              head over the base vocabulary; a SigLIP 2 so400m/14 ViT at 378x378 (width 1152, 16 heads of 72,
              MLP 4304, a learned 27x27 position table); an adapter that concatenates ViT layers 24 and 18, pools
              2x2 patches by attention (width 1152, 16 heads of 72) and projects them with a SwiGLU MLP (9728) to
              2560. config.json in the Hub's form (allenai's remote-code config, the form transformers 5.24's
              Molmo2Config reads as legacy: `vit_config` with image_default_input_size, image_patch_size and
              image_num_pos; the adapter's `vit_layers`; the text config's qkv_bias, layer_norm_eps, rope_theta
              and use_qk_norm; torch_dtype; auto_map); tensor names in the Hub's layout (model.transformer.*,
              model.vision_backbone.*, lm_head), which transformers writes back, with the embedding split as the
              Hub's: wte.embedding [151936, 2560] + wte.new_embedding [128, 2560] (transformers 5.24 writes two
              halves of the fused table; rewritten after the save). --vision-blocks counts the ViT layers stored
              and run: 25 at full depth, while vit_config declares 27, as the Hub's does (its checkpoints hold
              resblocks 0 to 24, the deepest layer the adapter reads); a reduced tower of m blocks declares m + 2
              and reads layers m - 1 and max(m - 7, 0), so `vit_layers` stays [-3, -9] from m = 7 on. Special
              tokens: the Qwen ones above, and the image tokens at 151936 and up (<im_start>, <im_end>,
              <im_patch>, <im_col>, <low_res_im_start>, <|image|>, <im_low>, <frame_start>, <frame_end>,
              <|video|>; the config's ids are transformers' Molmo2Config defaults, taken from Molmo2-8B). The
              processor is transformers' Molmo2Processor with its defaults, which are the released ones (378x378
              crops, up to 8 of them with 4-patch overlap margins, 2x2 pooling, mean and std 0.5); its chat
              template is the oracle fixture's ChatML one (gen_molmo2.CHAT_TEMPLATE: an image is <|image|> where
              the message puts it; the processor prepends <|endoftext|> as the BOS the real template omits).
              Directory molmo2-4b-<dtype>-L<n>-V<m>. Sources for the dimensions: Qwen3-4B's config.json
              (decoder widths, heads, vocabulary); mlx-vlm 0.7.10's molmo2 defaults, which are Molmo2-4B's (text
              2560 / 9728 / 36 layers, additional vocabulary 128, max_position_embeddings 36864, rope_theta 5e6
              where Qwen3-4B's base has 1e6, the adapter's MLP 9728 into 2560, <im_low> at 151942, "HF config
              says 27 but weights only have 25"); SigLIP 2 so400m-patch14-384's at 378 (ViT); transformers 5.24's
              Molmo2 config defaults and legacy hooks (from Molmo2-8B: vit_layers [-3, -9] of 27, the token ids).
  molmo       Molmo-7B-D (allenai/Molmo-7B-D-0924, MolmoForCausalLM, model_type molmo: the smallest public Molmo v1
              the molmo plugin serves; MolmoE-1B is a mixture of experts and is refused): a Qwen2-7B decoder, 28
              layers of width 3584 (28 heads of 128, 4 KV heads, biased fused q/k/v, fused up+gate projection of
              2 x 18944 rows, rope_theta 1e6, RMS eps 1e-6), a 152064-row token table plus 128 additional rows
              (the image tokens), an untied head (ff_out); a CLIP ViT-L/14 at 336x336 (width 1024, 16 heads of
              64, MLP 4096, 23 layers of which the adapter reads -2 and -9, so 22 run, a 577-row position table),
              2x2 attention pooling (mean query) over the two concatenated layers (2048 wide) and a SwiGLU
              projector (18944) into 3584. transformers has no Molmo v1: the checkpoint is in the form mlx-vlm
              0.7.10's models/molmo reads (its ModelConfig's defaults are Molmo-7B-D's), which is the one the
              plugin's fixture (tools/oracle/gen_molmo.py) has: config.json nested (text_config with d_model,
              n_heads, n_kv_heads, n_layers, mlp_hidden_size = the fused up+gate rows, embedding_size,
              additional_vocab_size; vision_config with image_emb_dim, image_num_layers, vit_layers, ...), the
              tensors under allenai's names (model.transformer.*, model.vision_backbone.*, which mlx-vlm's
              sanitize maps) with their shapes taken from mlx-vlm's own Model built at this config (lazily, never
              evaluated), preprocessor_config.json as Molmo-7B-D's (max_crops 12, overlap_margins [4, 4],
              336x336 crops of 14-pixel patches, 12x12 tokens per crop). Tokenizer: the Qwen specials above and
              <im_start>, <im_end>, <im_patch>, <im_col>, <|image|> right after the 152064-row table (the plugin
              derives their ids so, as Molmo's tokenizer places them); eos <|endoftext|>; the fixture's
              "User: ... Assistant:" chat template (gen_molmo.CHAT_TEMPLATE; the processor puts the image tokens
              before the text, and adds no BOS). --vision-blocks counts the declared ViT layers (image_num_layers,
              23 at full depth); a tower of m < 9 layers reads layers -1 and 0 instead of -2 and -9. Directory
              molmo-7b-d-<dtype>-L<n>-V<m>. Drawn tensor by tensor with randomize_mlx's scheme (numpy, sorted
              names, seed 1235) and written in shards as it goes, so the build holds about one shard.
  youtu_vl    Youtu-VL-4B-Instruct (tencent/Youtu-VL-4B-Instruct, YoutuVLForConditionalGeneration): Youtu-LLM's
              decoder, 40 layers of width 2560 with multi-head latent attention (32 heads; q_lora_rank 1536 with
              an RMS norm, kv_lora_rank 512 with an RMS norm, qk_nope_head_dim 128, qk_rope_head_dim 64 in one
              rotary key shared by the heads, v_head_dim 128, interleaved rotary pairs, rope_theta 5e5), a SwiGLU
              MLP of 9728, a 283386-row token table tied to the head; a SigLIP2 ViT (width 1152, 16 heads of 72,
              MLP 4304, 27 layers, 16-pixel patches, 2-D vision RoPE, no position table) windowed as Qwen2.5-VL's
              (window_size 256 pixels: 8x8 merged units, full attention in blocks 7, 15, 23 and 26), its
              post-layernorm, and a 2x2 patch merger (RMS norm, 4608 -> 4608 -> 2560 GELU MLP). transformers has
              no Youtu-VL: the dimensions are mlx-vlm 0.7.10's class defaults (models/youtu_vl/config.py), which
              are the 4B model's, and the checkpoint is in the Hugging Face layout mlx-vlm's sanitize reads and the
              oracle fixture (tools/oracle/gen_youtu_vl.py, tests/fixtures/youtu_vl) has: config.json flat (the
              text fields at the root beside vision_config, model_type youtu_vl; torch_dtype naming the stored
              dtype), tensors siglip2.vision_model.*, merger.* and model.*, each layer's kv_b_proj stored fused
              ([32 x (128 + 128), 512]; mlx-vlm splits it into embed_q and unembed_out on load), no lm_head (tied).
              Names and shapes come from mlx-vlm's Model built at this config (lazily, never evaluated), the split
              kv_b pair fused back as to_hf does. Special ids: Youtu-VL-4B's <|vision_start|> 128262,
              <|vision_end|> 128263, <|image_pad|> 128264, <|video_pad|> 128265 (mlx-vlm's ModelConfig defaults);
              <|endoftext|> at 128001, Youtu-LLM's eos (transformers' YoutuConfig default); <|im_start|> and
              <|im_end|> at 128256 and 128257, the first ids past Youtu-LLM's 128256-row base where Youtu-VL's added
              tokens begin (their real ids are not available offline: a stand-in placement). Filler pieces fill
              every other id of the 283386, so any generated id decodes to text. Chat template, eos, pad and bos
              as the fixture's (ChatML without a default system prompt, an image as
              <|vision_start|><|image_pad|><|vision_end|>; eos <|im_end|>, pad and bos <|endoftext|>). No
              preprocessor config: no reference processor exists (the real one is remote code); see the fixture's
              stand-in preprocessing, gen_youtu_vl.preprocess. A reduced tower keeps the full-attention rhythm:
              the blocks i with i % 8 == 7 below --vision-blocks and the last block (27 gives the real 7, 15, 23,
              26; 4 gives 3 alone). Directory youtu_vl-4b-<dtype>-L<n>-V<m>. Drawn tensor by tensor in sorted
              Hugging Face names (numpy, seed 1235; matrices N(0, 1/fan_in), the fused kv_b_proj's fan-in its
              512 latent columns; norm weights 1 + N(0, 0.1), biases N(0, 0.1)) and written in shards as it goes.
  gemma3n     gemma-3n-E2B-it (google/gemma-3n-E2B-it, Gemma3nForConditionalGeneration; the host's gemma3n plugin
              serves its audio path): built by transformers 5.24's own class at E2B's config and saved by it
              (config.json nested as transformers 5 writes it, its tensor names; the KV-shared layers have no k/v
              projections, as transformers 5 builds and writes them; the head tied, absent). The decoder: 30 layers
              of width 2048 (8 heads of 256, 2 KV heads, q/k RMS norms and a scaleless v norm, rope_theta 1e6 in the
              full-attention layers and 1e4 in the sliding ones, window 512), full attention in every 5th layer
              (4, 9, ..., 29), the last 10 layers KV-shared (20-29 reuse layer 18's sliding and layer 19's full
              cache), MLP 8192 in every layer (gelu tanh, activation sparsity 0.95 in layers 0-9), AltUp over 4
              streams, LAuReL rank 64, per-layer inputs of 256 per layer (a 262144 x 7680 table), the 262400-row
              token table tied to the head, final logit soft-cap 30. The audio encoder: Gemma3nAudioConfig's
              defaults, which are E2B's USM conformer (128 mel bins in, two subsampling convolutions of 128 and 32
              channels, 12 conformer layers of width 1536 with 8 heads, chunk 12, left context 13, logit cap 50,
              reduction 4), and the audio embedder (128 hard ids from 262272, into 2048). The vision tower is the
              real one, timm's mobilenetv5_300m_enc (0.29 B parameters; transformers builds and loads it, the host
              never reads it), with the vision embedder. Special ids: Gemma's (<pad> 0, <eos> 1, <bos> 2, <unk> 3,
              <mask> 4, [multimodal] 5, <start_of_turn> 105, <end_of_turn> 106) and Gemma3nConfig's defaults, which
              are E2B's (<start_of_image> 255999, <start_of_audio> 256000, <end_of_image> 262144,
              <image_soft_token> 262145, <end_of_audio> 262272, <audio_soft_token> 262273); the oracle BPE's 384
              pieces at ids 107-490 and fillers at every other id of the 262400 (gemma3n_tokenizer); eos <eos>,
              generation eos [1, 106]. Chat template: the fixture's (tools/oracle/gen_gemma3n.CHAT_TEMPLATE; the real
              one adds system-prompt handling). processor_config.json: Gemma3nProcessor, 188 soft tokens per clip
              and 256 per image, Gemma3nAudioFeatureExtractor with its defaults (128 mel bins, the released
              extractor's), a SigLIP image processor at 768x768 (not used by the host; assumed). Sources for E2B's
              values (offline): the E4B-shaped defaults of transformers' Gemma3nTextConfig, and for E2B's own
              differences public configs and code quoting google/gemma-3n-E2B-it's config.json: 30 layers,
              num_kv_shared_layers 10, intermediate 8192 (2048 x 4) in every layer, activation sparsity in the first
              10; everything else (widths, heads, vocabularies, per-layer input width, AltUp, LAuReL, window, rope,
              the audio config, the token ids, 188 audio soft tokens) is the same in E2B and E4B. --vision-blocks
              counts the audio encoder's conformer layers (12 at full depth), the encoder the host runs; the
              directory is gemma3n-e2b-<dtype>-L<n>-A<m>. A reduced decoder keeps E2B's rhythm (gemma3n_layers):
              full attention in every 5th layer (below 5 layers the last one), the last third KV-shared in whole
              5-layer units with at least one unit before them (10 to 20 layers: the last 5; fewer than 10: none),
              activation sparsity in the first third. Every float parameter is redrawn by randomize_blocked
              (torch, seed 1235, sorted names, matrices in blocks of rows), in the stored dtype's model, so bf16
              holds about 2 bytes a parameter while it is built.

Run with the oracle venv's python (torch, transformers 5.24):

    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/gen_ckpt.py                      # 28 text / 32 vision, bf16
    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/gen_ckpt.py --dtype f32 --text-layers 8 --vision-blocks 8
    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/gen_ckpt.py --family qwen2_5_vl    # 36 text / 32 vision, bf16
    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/gen_ckpt.py --family qwen3_vl      # 28 text / 24 vision, bf16
    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/gen_ckpt.py --family qwen3_vl --dtype f32 --text-layers 2 --vision-blocks 2
    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/gen_ckpt.py --family molmo2        # 36 text / 25 vision, bf16
    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/gen_ckpt.py --family molmo2 --text-layers 2 --vision-blocks 2
    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/gen_ckpt.py --family molmo --text-layers 4   # 4 of 28, full ViT
    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/gen_ckpt.py --family youtu_vl --text-layers 4 --vision-blocks 4
    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/gen_ckpt.py --family gemma3n      # 30 text / 12 audio, bf16
    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/gen_ckpt.py --family gemma3n --dtype f32 --text-layers 10

Prints the checkpoint directory (default under ~/.cache/mlxcel/bench/); an existing complete directory is
kept unless --force. Weights: seed 1235, matrices N(0, 1/fan_in), vectors default + N(0, 0.1) (the oracle's
scheme), drawn in f32 and then cast, so the bf16 and f32 checkpoints of one depth hold the same values up to
rounding. The whole f32 model is held in memory while it is drawn: about 4 bytes a parameter (8.8 GB for
Qwen2-VL-2B, 15 GB for Qwen2.5-VL-3B, 8.5 GB for Qwen3-VL-2B at full depth, whichever --dtype is stored).
Molmo2-4B (4.85 B parameters: 19.4 GB in f32, 9.7 GB in bf16) is built in bf16 when bf16 is stored, each
parameter drawn in f32 and rounded as it is drawn (the same values as drawing the f32 model and rounding it),
so its bf16 build holds about 2 bytes a parameter (9.7 GB). Molmo-7B-D and Youtu-VL-4B are drawn and written
tensor by tensor (about one shard held, the largest tensor drawn in f32: Youtu-VL's token table, 2.9 GB). Full-depth
Youtu-VL-4B is 5.34 B parameters as mlx-vlm's defaults build it (10.7 GB in bf16); 4 of 40 text layers and 4 of 27
vision blocks are 1.24 B (2.5 GB in bf16), most of it the tied 283386 x 2560 table. Gemma 3n E2B at full depth is
5.42 B parameters (4.44 B text, of which the per-layer table is 2.01 B and the token table 0.54 B; 0.68 B audio;
0.30 B vision): 10.8 GB in bf16, built in bf16 (f32 at full depth, 21.7 GB, does not fit a 24 GB machine; each layer
fewer takes 130 M parameters off, half of them the per-layer table's).
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

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "molmo2", "molmo", "youtu_vl", "gemma3n")
# Each family's real model: the directory name's stem and its full depth (text layers, vision blocks; Molmo2's
# vision blocks are the ViT layers stored and run, 25 of the 27 its config declares; Gemma 3n's "vision blocks"
# are its audio encoder's conformer layers, the encoder the host runs).
MODEL_NAME = {"qwen2_vl": "qwen2vl-2b", "qwen2_5_vl": "qwen2_5_vl-3b", "qwen3_vl": "qwen3_vl-2b", "molmo2": "molmo2-4b",
              "molmo": "molmo-7b-d", "youtu_vl": "youtu_vl-4b", "gemma3n": "gemma3n-e2b"}
# Molmo's vision blocks are the declared ViT layers (image_num_layers), of which the deepest feature layer and
# those before it run (22 of 23 for vit_layers [-2, -9]).
FULL_DEPTH = {"qwen2_vl": (28, 32), "qwen2_5_vl": (36, 32), "qwen3_vl": (28, 24), "molmo2": (36, 25), "molmo": (28, 23),
              "youtu_vl": (40, 27), "gemma3n": (30, 12)}
# The letter before the encoder depth in a checkpoint's directory name: V(ision blocks), A(udio conformer layers).
ENCODER_LETTER = {"gemma3n": "A"}
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
# Molmo2's image tokens, after the Qwen vocabulary's 151936 rows, in the order of the "additional" embedding rows
# (the oracle's tiny Molmo2 uses the same order; transformers' Molmo2Config defaults place <im_start>, <im_end>,
# <im_patch>, <im_col>, <low_res_im_start>, <frame_start> and <frame_end> at 151936-151940, 151943, 151944).
MOLMO2_SPECIALS = {t: VOCAB + i for i, t in enumerate(
    ["<im_start>", "<im_end>", "<im_patch>", "<im_col>", "<low_res_im_start>", "<|image|>", "<im_low>",
     "<frame_start>", "<frame_end>", "<|video|>"])}
MOLMO2_ADDITIONAL_VOCAB = 128


def molmo2_chat_template() -> str:
    import gen_molmo2  # tools/oracle

    return gen_molmo2.CHAT_TEMPLATE


CHAT_TEMPLATES = {"qwen2_vl": CHAT_TEMPLATE, "qwen2_5_vl": CHAT_TEMPLATE, "qwen3_vl": QWEN3_VL_CHAT_TEMPLATE}


def default_dir(dtype: str, text_layers: int, vision_blocks: int, family: str = "qwen2_vl") -> Path:
    letter = ENCODER_LETTER.get(family, "V")
    return BENCH_DIR / f"{MODEL_NAME[family]}-{dtype}-L{text_layers}-{letter}{vision_blocks}"


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


def molmo2_vit_layers(vision_blocks: int) -> tuple[int, list[int]]:
    """Molmo2's declared ViT depth and `vit_layers` for a tower of `vision_blocks` stored and run layers: the
    Hub's 27 declared for 25 stored, the adapter reading the last stored layer and the one 6 below it (24 and 18,
    [-3, -9] counted from 27); a tower shallower than 7 reads its last layer and layer 0."""
    declared = vision_blocks + 2
    return declared, [vision_blocks - 1 - declared, max(vision_blocks - 7, 0) - declared]


def molmo2_hub_config(text_layers: int, vision_blocks: int, dtype: str) -> dict:
    """Molmo2-4B's config.json in the Hub's form (allenai's remote-code config, which transformers 5.24's Molmo2Config
    reads as legacy), at the given depth, naming the stored dtype. The field set is that of the Hub's Molmo2
    configs as transformers' legacy hooks and other readers of them (vLLM, mlx-vlm) expect it; the dimensions are
    Molmo2-4B's (see the module docstring)."""
    declared, vit_layers = molmo2_vit_layers(vision_blocks)
    return {
        "architectures": ["Molmo2ForConditionalGeneration"], "model_type": "molmo2",
        "auto_map": {"AutoConfig": "configuration_molmo2.Molmo2Config",
                     "AutoModelForImageTextToText": "modeling_molmo2.Molmo2ForConditionalGeneration"},
        "image_start_token_id": MOLMO2_SPECIALS["<im_start>"],
        "low_res_image_start_token_id": MOLMO2_SPECIALS["<low_res_im_start>"],
        "image_end_token_id": MOLMO2_SPECIALS["<im_end>"], "image_patch_id": MOLMO2_SPECIALS["<im_patch>"],
        "image_col_id": MOLMO2_SPECIALS["<im_col>"], "frame_start_token_id": MOLMO2_SPECIALS["<frame_start>"],
        "frame_end_token_id": MOLMO2_SPECIALS["<frame_end>"], "initializer_range": 0.02,
        "tie_word_embeddings": False, "torch_dtype": {"f32": "float32", "bf16": "bfloat16"}[dtype], "use_cache": True,
        "text_config": {
            "model_type": "molmo2_text", "additional_vocab_size": MOLMO2_ADDITIONAL_VOCAB, "attention_dropout": 0.0,
            "embedding_dropout": 0.0, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2560,
            "initializer_range": 0.02, "intermediate_size": 9728, "layer_norm_eps": 1e-6,
            "max_position_embeddings": 36864, "norm_after": False, "num_attention_heads": 32,
            "num_hidden_layers": text_layers, "num_key_value_heads": 8, "qk_norm_type": "qwen3", "qkv_bias": False,
            "residual_dropout": 0.0, "rope_scaling": None, "rope_scaling_layers": None, "rope_theta": 5000000.0,
            "use_cache": True, "use_qk_norm": True, "vocab_size": VOCAB,
        },
        "vit_config": {
            "model_type": "molmo2", "attention_dropout": 0.0, "float32_attention": True, "head_dim": 72,
            "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1152, "image_default_input_size": [378, 378],
            "image_num_pos": 729, "image_patch_size": 14, "initializer_range": 0.02, "intermediate_size": 4304,
            "layer_norm_eps": 1e-6, "num_attention_heads": 16, "num_hidden_layers": declared,
            "num_key_value_heads": 16, "residual_dropout": 0.0,
        },
        "adapter_config": {
            "model_type": "molmo2", "attention_dropout": 0.0, "float32_attention": True, "head_dim": 72,
            "hidden_act": "silu", "hidden_size": 1152, "image_feature_dropout": 0.0, "initializer_range": 0.02,
            "intermediate_size": 9728, "num_attention_heads": 16, "num_key_value_heads": 16,
            "pooling_attention_mask": True, "residual_dropout": 0.0, "text_hidden_size": 2560,
            "vit_layers": vit_layers,
        },
    }


# The families whose config.json is written in the Hub's form: its maker, and the names of the transformers
# config and model classes built from it.
HUB_CONFIGS = {"qwen2_5_vl": (qwen2_5_vl_hub_config, "Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration"),
               "qwen3_vl": (qwen3_vl_hub_config, "Qwen3VLConfig", "Qwen3VLForConditionalGeneration"),
               "molmo2": (molmo2_hub_config, "Molmo2Config", "Molmo2ForConditionalGeneration")}


def filler_name(n: int) -> str:
    """A filler piece's text for token id n: the id in base 36 (the pieces that fill a tokenizer's unused ids)."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    s = ""
    while True:
        n, r = divmod(n, 36)
        s = digits[r] + s
        if n == 0:
            return s


def tokenizer(chat_template: str = CHAT_TEMPLATE, family: str = "qwen2_vl"):
    """The oracle's byte-level BPE (384 trained pieces), filler pieces up to id 151642, the specials at their
    real ids. Fillers are never produced by encoding (no merges lead to them) but decode to ` #<id in base
    36>`, so generated ids stream as text as they would with the real vocab. Molmo2's adds its image tokens
    after the base vocabulary, names <|image|> and <|video|> (its processor reads them), and has
    <|endoftext|> for its eos, which the processor prepends as BOS. Youtu-VL's has its own specials
    (YOUTU_VL_SPECIALS, none of the Qwen ones) and fillers at every other id of its 283386-row table."""
    import common
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(common.build_tokenizer([]).to_str())
    vocab = spec["model"]["vocab"]
    base = len(vocab)

    if family == "youtu_vl":
        specials = dict(YOUTU_VL_SPECIALS)
        fill = [i for i in range(base, YOUTU_VL_VOCAB) if i not in set(specials.values())]
    else:
        specials = {**SPECIALS, **({"molmo2": MOLMO2_SPECIALS, "molmo": MOLMO_SPECIALS}.get(family, {}))}
        fill = range(base, min(SPECIALS.values()))
    for i in fill:
        piece = "Ġ#" + filler_name(i)  # "Ġ" is the byte-level form of a space
        if piece in vocab:
            raise RuntimeError(f"filler {piece} collides with a trained piece")
        vocab[piece] = i
    template = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
    spec["added_tokens"] = [dict(template, id=i, content=t) for t, i in specials.items()]
    for t, i in specials.items():
        vocab[t] = i
    tok = Tokenizer.from_str(json.dumps(spec))
    for t, i in specials.items():
        assert tok.token_to_id(t) == i, t
    probe = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe this image.<|im_end|>\n"
    if family == "molmo":
        probe = "<im_start><im_patch><im_col><im_end>User: Describe this image.\nAssistant:"
    if family == "molmo2":
        probe = ("<|endoftext|><|im_start|>user\n<low_res_im_start><im_patch><im_col><im_end><im_start><im_patch>"
                 "<im_end>Describe this image.<|im_end|>\n")
    assert tok.decode(tok.encode(probe).ids, skip_special_tokens=False) == probe
    if family == "molmo2":
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                     image_token="<|image|>", video_token="<|video|>")
    elif family == "molmo":
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    else:
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    hf.chat_template = chat_template
    return hf


def processor(tok, family: str = "qwen2_vl"):
    import transformers
    from transformers import Qwen2VLImageProcessorPil, Qwen2VLVideoProcessor, Qwen3VLVideoProcessor

    if family == "molmo2":
        # transformers' defaults are the released Molmo2 processor's (378x378 crops, up to 8 of them with
        # 4-patch overlap margins, 2x2 pooling for images and 3x3 for video frames, mean and std 0.5,
        # bilinear); the image processor has only the torchvision backend.
        from transformers import Molmo2ImageProcessor, Molmo2Processor, Molmo2VideoProcessor

        return Molmo2Processor(image_processor=Molmo2ImageProcessor(), video_processor=Molmo2VideoProcessor(),
                               tokenizer=tok, chat_template=molmo2_chat_template())
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


def chat_template(family: str) -> str:
    return molmo2_chat_template() if family == "molmo2" else CHAT_TEMPLATES[family]


def randomize_narrow(model, seed: int) -> None:
    """common.randomize's draw for a model built in a narrower dtype: each parameter drawn in f32 exactly as
    common.randomize draws it on the f32 model (same generator, same order, same arithmetic) and rounded once as
    it is stored, so the values are the f32 draw's rounded, without holding the f32 model (Molmo2-4B: 19.4 GB).
    Exact as long as every vector's default is exact in the narrow dtype (the 0 and 1 of norms and biases)."""
    import numpy as np
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if not p.is_floating_point():
                continue
            if p.dim() >= 2:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) / fan_in**0.5)
            else:
                p.copy_(p.float() + torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.1)
    model.eval()


def molmo2_fix_embedding_split(ckpt: Path, vocab: int) -> None:
    """transformers 5.24 saves Molmo2's fused embedding back as two halves of the table; the Hub's checkpoints (and
    the oracle's fixtures, gen_molmo2.fix_embedding_split) split it at the base vocabulary: wte.embedding
    [vocab, hidden] + wte.new_embedding [additional, hidden]. Rewrites the shard or shards holding them; the index
    keeps its map and total size."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    base, extra = "model.transformer.wte.embedding", "model.transformer.wte.new_embedding"
    index = ckpt / "model.safetensors.index.json"
    where = (json.loads(index.read_text())["weight_map"] if index.exists()
             else {base: "model.safetensors", extra: "model.safetensors"})
    shards = {name: {} for name in {where[base], where[extra]}}
    for name, tensors in shards.items():
        with safe_open(ckpt / name, "pt") as f:
            metadata = f.metadata()
            for k in f.keys():
                tensors[k] = f.get_tensor(k)
        shards[name] = (tensors, metadata)
    full = torch.cat([shards[where[base]][0][base], shards[where[extra]][0][extra]])
    shards[where[base]][0][base] = full[:vocab].clone()
    shards[where[extra]][0][extra] = full[vocab:].clone()
    for name, (tensors, metadata) in shards.items():
        save_file(tensors, ckpt / name, metadata=metadata)


# ------------------------------------------------------------------------------------------------
# Molmo (v1): Molmo-7B-D, in the form mlx-vlm's models/molmo reads (transformers has no Molmo v1)

MOLMO_VOCAB = 152064  # Molmo-7B-D's token table (embedding_size = vocab_size), the head's rows
MOLMO_ADDITIONAL_VOCAB = 128
# Molmo's image tokens right after the table, in the order the plugin derives their ids (<im_start>, <im_end>,
# <im_patch>, <im_col>), then <|image|>.
MOLMO_SPECIALS = {t: MOLMO_VOCAB + i for i, t in enumerate(["<im_start>", "<im_end>", "<im_patch>", "<im_col>",
                                                             "<|image|>"])}
# Molmo-7B-D's preprocessor_config.json fields that mlx-vlm's MolmoProcessor and the plugin read.
MOLMO_PREPROCESSOR = {
    "max_crops": 12, "overlap_margins": [4, 4], "base_image_input_size": [336, 336], "image_token_length_w": 12,
    "image_token_length_h": 12, "image_patch_size": 14, "image_padding_mask": True, "do_normalize": True,
}


def molmo_config(text_layers: int, vision_blocks: int, dtype: str) -> dict:
    """Molmo-7B-D's config.json in mlx-vlm's nested form (the fixture's), at the given depth, naming the stored
    dtype."""
    return {
        "architectures": ["MolmoForCausalLM"], "model_type": "molmo",
        "torch_dtype": {"f32": "float32", "bf16": "bfloat16"}[dtype], "eos_token_id": [SPECIALS["<|endoftext|>"]],
        "text_config": {
            "model_type": "molmo", "d_model": 3584, "n_heads": 28, "n_kv_heads": 4, "n_layers": text_layers,
            "mlp_hidden_size": 37888, "mlp_ratio": 4, "act_output_multiplier": 0.5, "vocab_size": MOLMO_VOCAB,
            "embedding_size": MOLMO_VOCAB, "additional_vocab_size": MOLMO_ADDITIONAL_VOCAB,
            "max_position_embeddings": 4096, "max_sequence_length": 4096, "rope_theta": 1000000.0,
            "layer_norm_eps": 1e-6, "qkv_bias": True, "weight_tying": False,
        },
        "vision_config": {
            "model_type": "molmo", "image_default_input_size": [336, 336], "image_patch_size": 14,
            "image_pos_patch_size": 14, "hidden_size": 18944, "image_emb_dim": 1024, "image_num_heads": 16,
            "image_num_key_value_heads": 16, "image_num_layers": vision_blocks, "image_head_dim": 64,
            "image_mlp_dim": 4096, "image_mlp_activations": "gelu", "image_num_pos": 577, "image_norm_eps": 1e-5,
            "d_model": 3584, "image_pooling_h": 2, "image_pooling_w": 2,
            "vit_layers": [-2, -9] if vision_blocks >= 9 else [-1, -vision_blocks],
            "image_pooling_2d": "attention-meanq", "image_padding_embed": "pad_and_partial_pad",
        },
    }


def molmo_tokenizer():
    """gen_ckpt's byte-level BPE with the Qwen specials, Molmo's image tokens after the 152064-row table, eos
    <|endoftext|>, the fixture's chat template."""
    import gen_molmo  # tools/oracle

    return tokenizer(gen_molmo.CHAT_TEMPLATE, "molmo")


def build_molmo(out: Path, dtype: str, text_layers: int, vision_blocks: int, shard: str) -> dict:
    """Molmo-7B-D at the given depth: names and shapes from mlx-vlm's Model (built lazily, never evaluated but for
    the vectors' defaults), each tensor drawn as common.randomize_mlx draws it (numpy, sorted names, seed 1235),
    cast and written in shards of at most `shard` as it goes."""
    import common
    import gen_molmo
    import mlx.core as mx
    import mlx_vlm.models.molmo as molmo
    import numpy as np
    import torch
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import update_module_configs
    from safetensors.torch import save_file

    cfg_json = molmo_config(text_layers, vision_blocks, dtype)
    timings = {}
    t = time.perf_counter()
    cfg = molmo.ModelConfig.from_dict(cfg_json)
    cfg = update_module_configs(cfg, molmo, json.loads(json.dumps(cfg_json)), ["text", "vision"])
    model = molmo.Model(cfg)
    params = sorted(tree_flatten(model.parameters()), key=lambda kv: kv[0])
    timings["construct_s"] = time.perf_counter() - t
    limit = int(float(shard.rstrip("GB")) * 1e9) if shard.endswith("GB") else int(shard)
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    rng = np.random.default_rng(common.SEED + 1)
    shards, current, size, weight_map, total = [], {}, 0, {}, 0
    counts = {"total": 0, "text": 0, "vision": 0}

    def flush():
        nonlocal current, size
        if current:
            name = f"model-{len(shards) + 1:05d}.safetensors"
            save_file(current, str(tmp / name), metadata={"format": "pt"})
            shards.append(name)
            weight_map.update({k: name for k in current})
            current, size = {}, 0

    t = time.perf_counter()
    for name, p in params:
        if p.ndim >= 2:
            fan_in = int(np.prod(p.shape[1:]))
            v = rng.standard_normal(p.shape, dtype=np.float32) / np.float32(fan_in**0.5)
        else:
            v = np.array(p.astype(mx.float32)) + rng.standard_normal(p.shape, dtype=np.float32) * np.float32(0.1)
        tensor = torch.from_numpy(v).to(torch_dtype).contiguous()
        del v
        nbytes = tensor.numel() * tensor.element_size()
        if size and size + nbytes > limit:
            flush()
        key = gen_molmo.to_allenai(name)
        current[key] = tensor
        size += nbytes
        total += nbytes
        counts["total"] += tensor.numel()
        counts["vision" if key.startswith("model.vision_backbone.") else "text"] += tensor.numel()
    flush()
    timings["fill_and_save_s"] = time.perf_counter() - t
    # Renumber as HF does (model-0000i-of-0000n), with the index.
    n = len(shards)
    renamed = {}
    for i, name in enumerate(shards):
        new = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        (tmp / name).rename(tmp / new)
        renamed[name] = new
    weight_map = {k: renamed[v] for k, v in sorted(weight_map.items())}
    (tmp / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1) + "\n")
    (tmp / "config.json").write_text(json.dumps(cfg_json, indent=1) + "\n")
    (tmp / "preprocessor_config.json").write_text(json.dumps(MOLMO_PREPROCESSOR, indent=1) + "\n")
    molmo_tokenizer().save_pretrained(tmp)
    # What the plugin reads of the checkpoint must be what mlx-vlm builds from it: the shapes it would load.
    want = {gen_molmo.to_allenai(k): tuple(p.shape) for k, p in params}
    assert want["model.transformer.wte.embedding"] == (MOLMO_VOCAB, 3584)
    assert want["model.transformer.blocks.0.ff_proj.weight"] == (37888, 3584)
    files = {f.name: f.stat().st_size for f in sorted(tmp.iterdir())}
    info = {
        "generator": "tools/bench/gen_ckpt.py", "family": "molmo", "dtype": dtype, "text_layers": text_layers,
        "vision_blocks": vision_blocks, "params": counts, "bytes": sum(files.values()), "files": files,
        "seed": common.SEED, "timings_s": {k: round(v, 1) for k, v in timings.items()},
    }
    (tmp / DONE).write_text(json.dumps(info, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return info


# ------------------------------------------------------------------------------------------------
# Youtu-VL: Youtu-VL-4B-Instruct, in the Hugging Face layout mlx-vlm's models/youtu_vl reads (transformers has none)

YOUTU_VL_VOCAB = 283386  # Youtu-VL-4B's token table, tied to the head
# Youtu-VL-4B's vision ids (mlx-vlm 0.7.10's ModelConfig defaults); <|endoftext|> at Youtu-LLM's eos id
# (transformers' YoutuConfig default, 128001); the ChatML pair, whose real ids are not available offline, at the
# first ids past Youtu-LLM's 128256-row base (a stand-in placement).
YOUTU_VL_SPECIALS = {
    "<|endoftext|>": 128001, "<|im_start|>": 128256, "<|im_end|>": 128257, "<|vision_start|>": 128262,
    "<|vision_end|>": 128263, "<|image_pad|>": 128264, "<|video_pad|>": 128265,
}
# Youtu-VL-4B's full-attention vision blocks (of 27).
YOUTU_VL_FULLATT = (7, 15, 23, 26)


def youtu_vl_fullatt_blocks(depth: int) -> list[int]:
    """Youtu-VL's full-attention blocks for a tower of `depth`: every 8th (i % 8 == 7) and the last, which is the real
    tower's 7, 15, 23, 26 at 27; a reduced tower keeps that rhythm (4 blocks: block 3 alone), so windowed and full
    blocks both run from depth 2 on."""
    return sorted({i for i in range(depth) if i % 8 == 7} | {depth - 1})


def youtu_vl_config(text_layers: int, vision_blocks: int, dtype: str) -> dict:
    """Youtu-VL-4B's config.json in the fixture's flat form (the text fields at the root beside vision_config, as
    mlx-vlm's ModelConfig.from_dict reads them), at the given depth, naming the stored dtype. The dimensions are
    mlx-vlm 0.7.10's class defaults, which are the 4B model's."""
    ids = YOUTU_VL_SPECIALS
    assert youtu_vl_fullatt_blocks(27) == list(YOUTU_VL_FULLATT)
    return {
        "architectures": ["YoutuVLForConditionalGeneration"], "model_type": "youtu_vl",
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": [ids["<|im_end|>"]], "pad_token_id": ids["<|endoftext|>"],
        "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": text_layers, "num_attention_heads": 32,
        "num_key_value_heads": 32, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        "rope_interleave": True, "rope_theta": 500000.0, "tie_word_embeddings": True, "attention_bias": False,
        "mlp_bias": False, "vocab_size": YOUTU_VL_VOCAB, "torch_dtype": {"f32": "float32", "bf16": "bfloat16"}[dtype],
        "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
        "vision_config": {
            "model_type": "siglip2_vision_model", "hidden_size": 1152, "out_hidden_size": 2560,
            "intermediate_size": 4304, "num_hidden_layers": vision_blocks, "num_attention_heads": 16,
            "num_channels": 3, "num_patches": 4096, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6, "spatial_merge_size": 2, "window_size": 256,
            "fullatt_block_indexes": youtu_vl_fullatt_blocks(vision_blocks),
        },
    }


def youtu_vl_tensors(cfg_json: dict) -> dict[str, tuple[int, ...]]:
    """The Hugging Face tensor names and shapes of a Youtu-VL checkpoint at `cfg_json`: mlx-vlm's Model built at it
    (lazily, never evaluated), its names mapped back as gen_youtu_vl.to_hf maps them (siglip2.vision_model.*,
    merger.*, model.*; no lm_head, tied) and each layer's embed_q [heads, latent, nope] and unembed_out
    [heads, v, latent] fused back into kv_b_proj [heads * (nope + v), latent]."""
    import mlx_vlm.models.youtu_vl as youtu
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import update_module_configs

    raw = json.loads(json.dumps(cfg_json))
    cfg = youtu.ModelConfig.from_dict(raw)
    cfg = update_module_configs(cfg, youtu, json.loads(json.dumps(cfg_json)), ["text", "vision"])
    model = youtu.Model(cfg)
    tc = cfg.text_config
    out = {}
    for k, v in tree_flatten(model.parameters()):
        if k.startswith("vision_tower.merger."):
            k = k.removeprefix("vision_tower.")
        elif k.startswith("vision_tower."):
            k = "siglip2.vision_model." + k.removeprefix("vision_tower.")
        elif k.startswith("language_model.model."):
            k = "model." + k.removeprefix("language_model.model.")
        else:
            raise RuntimeError(f"youtu_vl: unexpected parameter {k}")  # an untied lm_head
        if k.endswith((".embed_q.weight", ".unembed_out.weight")):
            continue
        out[k] = tuple(v.shape)
    for layer in range(tc.num_hidden_layers):
        fused = (tc.num_attention_heads * (tc.qk_nope_head_dim + tc.v_head_dim), tc.kv_lora_rank)
        out[f"model.layers.{layer}.self_attn.kv_b_proj.weight"] = fused
    return dict(sorted(out.items()))


def youtu_vl_tokenizer():
    """gen_ckpt's byte-level BPE with Youtu-VL's specials at their ids (YOUTU_VL_SPECIALS), fillers up to the 283386
    rows, the fixture's chat template (gen_youtu_vl.CHAT_TEMPLATE), eos <|im_end|>, pad <|endoftext|>."""
    import gen_youtu_vl  # tools/oracle

    return tokenizer(gen_youtu_vl.CHAT_TEMPLATE, "youtu_vl")


def build_youtu_vl(out: Path, dtype: str, text_layers: int, vision_blocks: int, shard: str) -> dict:
    """Youtu-VL-4B at the given depth: names and shapes from youtu_vl_tensors, each tensor drawn in sorted name order
    (numpy, seed 1235: matrices N(0, 1/fan_in), norm weights 1 + N(0, 0.1), biases N(0, 0.1)), cast and written in
    shards of at most `shard` as it goes."""
    import common
    import numpy as np
    import torch
    from safetensors.torch import save_file

    cfg_json = youtu_vl_config(text_layers, vision_blocks, dtype)
    timings = {}
    t = time.perf_counter()
    shapes = youtu_vl_tensors(cfg_json)
    timings["construct_s"] = time.perf_counter() - t
    want = {"model.embed_tokens.weight": (YOUTU_VL_VOCAB, 2560),
            "model.layers.0.self_attn.kv_b_proj.weight": (32 * 256, 512),
            "model.layers.0.self_attn.q_b_proj.weight": (32 * 192, 1536),
            "model.layers.0.self_attn.kv_a_proj_with_mqa.weight": (576, 2560),
            "model.layers.0.mlp.gate_proj.weight": (9728, 2560),
            "siglip2.vision_model.embeddings.patch_embedding.weight": (1152, 768),
            "siglip2.vision_model.encoder.layers.0.mlp.fc1.weight": (4304, 1152),
            "merger.mlp.0.weight": (4608, 4608), "merger.mlp.2.weight": (2560, 4608)}
    for k, shape in want.items():
        assert shapes.get(k) == shape, f"youtu_vl: {k} is {shapes.get(k)}, expected {shape}"
    limit = int(float(shard.rstrip("GB")) * 1e9) if shard.endswith("GB") else int(shard)
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    rng = np.random.default_rng(common.SEED + 1)
    shards, current, size, weight_map, total = [], {}, 0, {}, 0
    counts = {"total": 0, "text": 0, "vision": 0}

    def flush():
        nonlocal current, size
        if current:
            name = f"model-{len(shards) + 1:05d}.safetensors"
            save_file(current, str(tmp / name), metadata={"format": "pt"})
            shards.append(name)
            weight_map.update({k: name for k in current})
            current, size = {}, 0

    t = time.perf_counter()
    for key, shape in shapes.items():
        if len(shape) >= 2:
            fan_in = int(np.prod(shape[1:]))
            v = rng.standard_normal(shape, dtype=np.float32) / np.float32(fan_in**0.5)
        else:
            default = np.float32(0.0 if key.endswith(".bias") else 1.0)
            v = default + rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1)
        tensor = torch.from_numpy(v).to(torch_dtype).contiguous()
        del v
        nbytes = tensor.numel() * tensor.element_size()
        if size and size + nbytes > limit:
            flush()
        current[key] = tensor
        size += nbytes
        total += nbytes
        counts["total"] += tensor.numel()
        counts["text" if key.startswith("model.") else "vision"] += tensor.numel()
    flush()
    timings["fill_and_save_s"] = time.perf_counter() - t
    n = len(shards)
    renamed = {}
    for i, name in enumerate(shards):
        new = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        (tmp / name).rename(tmp / new)
        renamed[name] = new
    weight_map = {k: renamed[v] for k, v in sorted(weight_map.items())}
    (tmp / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1) + "\n")
    (tmp / "config.json").write_text(json.dumps(cfg_json, indent=1) + "\n")
    ids = YOUTU_VL_SPECIALS
    (tmp / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": [ids["<|im_end|>"]],
         "pad_token_id": ids["<|endoftext|>"], "do_sample": False}, indent=1) + "\n")
    youtu_vl_tokenizer().save_pretrained(tmp)
    files = {f.name: f.stat().st_size for f in sorted(tmp.iterdir())}
    info = {
        "generator": "tools/bench/gen_ckpt.py", "family": "youtu_vl", "dtype": dtype, "text_layers": text_layers,
        "vision_blocks": vision_blocks, "params": counts, "bytes": sum(files.values()), "files": files,
        "seed": common.SEED, "timings_s": {k: round(v, 1) for k, v in timings.items()},
    }
    (tmp / DONE).write_text(json.dumps(info, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return info


# ------------------------------------------------------------------------------------------------
# Gemma 3n: gemma-3n-E2B-it (Gemma3nForConditionalGeneration), the audio path the gemma3n plugin serves

GEMMA3N_VOCAB = 262400  # text_config.vocab_size: 262144 text ids, 128 vision ids, 128 audio ids; tied to the head
GEMMA3N_TEXT_VOCAB = 262144  # vocab_size_per_layer_input: the ids the per-layer table embeds
# Gemma's specials at their real ids: the text ones of Gemma 3's tokenizer (pad, eos, bos, unk, mask, turns), the
# multimodal ones at transformers' Gemma3nConfig defaults (boi 255999, boa 256000, eoi 262144, image 262145,
# eoa 262272, audio 262273), which are gemma-3n-E2B-it's.
GEMMA3N_SPECIALS = {
    "<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4, "[multimodal]": 5, "<start_of_turn>": 105,
    "<end_of_turn>": 106, "<start_of_image>": 255999, "<start_of_audio>": 256000, "<end_of_image>": 262144,
    "<image_soft_token>": 262145, "<end_of_audio>": 262272, "<audio_soft_token>": 262273,
}
# Where the oracle BPE's 384 trained pieces go (ids 107 to 490): past <end_of_turn>, clear of every special.
GEMMA3N_BASE_ID = 107
GEMMA3N_AUDIO_TOKENS, GEMMA3N_IMAGE_TOKENS = 188, 256  # soft tokens per clip / per image
GEMMA3N_PATTERN = 5  # the layer rhythm: four sliding-window layers, then a full-attention one
GEMMA3N_WINDOW = 512


def gemma3n_layers(text_layers: int) -> dict:
    """gemma-3n-E2B's layer rhythm for a decoder of `text_layers`: full attention in every 5th layer ((i + 1) % 5 == 0;
    below 5 layers the last one, so both kinds run from 2 layers on); the last third of the layers KV-shared, in whole
    units of the 5-layer rhythm, leaving at least one whole unit before them, so each kind of shared layer has a
    producer of its kind (30 layers: the real 10, layers 20-29 reusing layer 18's sliding and layer 19's full cache;
    10 to 20 layers: 5; fewer than 10: none); activation sparsity (0.95) in the first third (30 layers: the real 10)."""
    types = ["full_attention" if (i + 1) % GEMMA3N_PATTERN == 0 else "sliding_attention" for i in range(text_layers)]
    if "full_attention" not in types:
        types[-1] = "full_attention"
    units = min(round(text_layers / (3 * GEMMA3N_PATTERN)), max((text_layers - GEMMA3N_PATTERN) // GEMMA3N_PATTERN, 0))
    shared = GEMMA3N_PATTERN * units
    sparse = round(text_layers / 3)
    return {"layer_types": types, "num_kv_shared_layers": shared,
            "activation_sparsity_pattern": [0.95] * sparse + [0.0] * (text_layers - sparse)}


def gemma3n_config(text_layers: int, audio_layers: int):
    """gemma-3n-E2B-it's Gemma3nConfig at the given depths (see the module docstring for what is assumed)."""
    from transformers import Gemma3nConfig

    assert gemma3n_layers(30)["num_kv_shared_layers"] == 10
    ids = GEMMA3N_SPECIALS
    return Gemma3nConfig(
        text_config=dict(
            vocab_size=GEMMA3N_VOCAB, vocab_size_per_layer_input=GEMMA3N_TEXT_VOCAB, hidden_size=2048,
            intermediate_size=[8192] * text_layers, num_hidden_layers=text_layers, num_attention_heads=8,
            num_key_value_heads=2, head_dim=256, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=32768,
            rms_norm_eps=1e-6, sliding_window=GEMMA3N_WINDOW, final_logit_softcapping=30.0,
            hidden_size_per_layer_input=256, altup_num_inputs=4, altup_active_idx=0, altup_coef_clip=120.0,
            altup_correct_scale=True, laurel_rank=64,
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
            pad_token_id=ids["<pad>"], eos_token_id=[ids["<eos>"], ids["<end_of_turn>"]], bos_token_id=ids["<bos>"],
            tie_word_embeddings=True, **gemma3n_layers(text_layers),
        ),
        # Gemma3nAudioConfig's defaults are E2B's (and E4B's) USM conformer; spelled out so the file says them.
        audio_config=dict(
            vocab_size=128, vocab_offset=GEMMA3N_TEXT_VOCAB + 128, input_feat_size=128, hidden_size=1536,
            rms_norm_eps=1e-6, gradient_clipping=1e10, conf_attention_chunk_size=12, conf_attention_context_left=13,
            conf_attention_context_right=0, conf_attention_logit_cap=50.0, conf_num_attention_heads=8,
            conf_num_hidden_layers=audio_layers, conf_conv_kernel_size=5, conf_reduction_factor=4,
            conf_residual_weight=0.5, sscp_conv_channel_size=[128, 32], sscp_conv_group_norm_eps=1e-3,
            sscp_conv_kernel_size=[[3, 3], [3, 3]], sscp_conv_stride_size=[[2, 2], [2, 2]],
        ),
        # The real tower, timm's MobileNetV5-300M encoder (not run here: the host serves no images).
        vision_config=dict(architecture="mobilenetv5_300m_enc", hidden_size=2048, vocab_size=128,
                           vocab_offset=GEMMA3N_TEXT_VOCAB, rms_norm_eps=1e-6, do_pooling=False),
        audio_soft_tokens_per_image=GEMMA3N_AUDIO_TOKENS, vision_soft_tokens_per_image=GEMMA3N_IMAGE_TOKENS,
        boi_token_id=ids["<start_of_image>"], eoi_token_id=ids["<end_of_image>"],
        image_token_id=ids["<image_soft_token>"], boa_token_id=ids["<start_of_audio>"],
        eoa_token_id=ids["<end_of_audio>"], audio_token_id=ids["<audio_soft_token>"], tie_word_embeddings=True,
    )


def gemma3n_tokenizer():
    """The oracle's byte-level BPE (384 trained pieces) moved to ids 107-490, Gemma's specials at their real ids
    (GEMMA3N_SPECIALS), filler pieces at every other id of the 262400 (each decodes to ` #<id in base 36>`, so any
    generated id streams as text), the named tokens Gemma3nProcessor reads, and the fixture's chat template
    (gen_gemma3n.CHAT_TEMPLATE: <bos>, <start_of_turn>user, an audio part as <audio_soft_token>)."""
    import common
    import gen_gemma3n  # tools/oracle
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(common.build_tokenizer([]).to_str())
    trained = spec["model"]["vocab"]
    vocab = {piece: GEMMA3N_BASE_ID + i for piece, i in trained.items()}
    taken = set(vocab.values()) | set(GEMMA3N_SPECIALS.values())
    assert not set(vocab.values()) & set(GEMMA3N_SPECIALS.values())

    for i in range(GEMMA3N_VOCAB):
        if i not in taken:
            piece = "Ġ#" + filler_name(i)
            if piece in vocab:
                raise RuntimeError(f"filler {piece} collides with a trained piece")
            vocab[piece] = i
    template = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
    spec["added_tokens"] = [dict(template, id=i, content=t) for t, i in GEMMA3N_SPECIALS.items()]
    vocab.update(GEMMA3N_SPECIALS)
    spec["model"]["vocab"] = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    assert len(spec["model"]["vocab"]) == GEMMA3N_VOCAB
    tok = Tokenizer.from_str(json.dumps(spec))
    for t, i in GEMMA3N_SPECIALS.items():
        assert tok.token_to_id(t) == i, t
    probe = ("<bos><start_of_turn>user\n\n\n<start_of_audio><audio_soft_token><audio_soft_token><end_of_audio>\n\n"
             "Transcribe this audio.<end_of_turn>\n<start_of_turn>model\n")
    assert tok.decode(tok.encode(probe).ids, skip_special_tokens=False) == probe
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        boi_token="<start_of_image>", eoi_token="<end_of_image>", image_token="<image_soft_token>",
        boa_token="<start_of_audio>", eoa_token="<end_of_audio>", audio_token="<audio_soft_token>",
    )
    hf.chat_template = gen_gemma3n.CHAT_TEMPLATE
    return hf


def gemma3n_processor(tok):
    """Gemma3nProcessor as gemma-3n-E2B-it's: Gemma3nAudioFeatureExtractor with its defaults, which are the released
    ones (128 mel bins, 16 kHz, 32 ms frames every 10 ms, FFT 1024 with overdrive, 125-7600 Hz, pre-emphasis 0.97 HTK,
    mel floor 1e-5, no dither, no per-bin normalisation), 188 soft tokens per clip; SigLIP's image processor at
    768x768 (bilinear, rescaled to [0, 1], not normalised) and 256 per image, never used by the host (assumed)."""
    from transformers import Gemma3nAudioFeatureExtractor, Gemma3nProcessor, SiglipImageProcessorPil

    image = SiglipImageProcessorPil(size={"height": 768, "width": 768}, resample=2, do_normalize=False)
    return Gemma3nProcessor(feature_extractor=Gemma3nAudioFeatureExtractor(), image_processor=image, tokenizer=tok,
                            chat_template=tok.chat_template, audio_seq_length=GEMMA3N_AUDIO_TOKENS,
                            image_seq_length=GEMMA3N_IMAGE_TOKENS)


def randomize_blocked(model, seed: int, block: int = 1 << 26) -> None:
    """common.randomize's scheme (matrices N(0, 1/fan_in), vectors their initialised value + N(0, 0.1)) for a model of
    any dtype, each draw in f32 and rounded once as it is stored, a matrix drawn in blocks of rows of at most `block`
    values (torch.Generator, seed, sorted names, rows in order), so no f32 copy of a large table is held (Gemma 3n
    E2B's per-layer table is 262144 x 7680: 8 GB in f32). The f32 and bf16 builds of one shape draw the same values."""
    import numpy as np
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if not p.is_floating_point():
                continue
            if p.dim() >= 2:
                fan_in = int(np.prod(p.shape[1:]))
                rows = max(1, block // fan_in)
                for r in range(0, p.shape[0], rows):
                    part = p[r:r + rows]
                    part.copy_(torch.randn(part.shape, generator=gen, dtype=torch.float32) / fan_in**0.5)
            else:
                p.copy_(p.float() + torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.1)
    model.eval()


def check_gemma3n_tensors(ckpt: Path, text_layers: int, audio_layers: int, shared: int) -> dict:
    """The written checkpoint holds transformers 5's Gemma 3n names and E2B's shapes (read from the safetensors
    headers): `text_layers` decoder layers, of which the last `shared` have no k/v projections, `audio_layers`
    conformer layers, the tied head absent."""
    from safetensors import safe_open

    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    shapes = {}
    for name in sorted(set(index.values())):
        with safe_open(ckpt / name, "pt") as f:
            shapes.update({k: f.get_slice(k).get_shape() for k in f.keys()})
    assert set(shapes) == set(index), "the index and the shards disagree"
    lm = "model.language_model."
    want = {lm + "embed_tokens.weight": [GEMMA3N_VOCAB, 2048],
            lm + "embed_tokens_per_layer.weight": [GEMMA3N_TEXT_VOCAB, 256 * text_layers],
            lm + "per_layer_model_projection.weight": [256 * text_layers, 2048],
            lm + "altup_projections.0.weight": [2048, 2048],
            lm + "layers.0.self_attn.q_proj.weight": [2048, 2048], lm + "layers.0.self_attn.k_proj.weight": [512, 2048],
            lm + "layers.0.mlp.gate_proj.weight": [8192, 2048], lm + "layers.0.laurel.linear_left.weight": [64, 2048],
            lm + "layers.0.per_layer_input_gate.weight": [256, 2048],
            "model.audio_tower.subsample_conv_projection.input_proj_linear.weight": [1536, 1024],
            "model.audio_tower.conformer.0.attention.attn.q_proj.weight": [1536, 1536],
            "model.embed_audio.embedding.weight": [128, 1536],
            "model.embed_audio.embedding_projection.weight": [2048, 1536]}
    for k, shape in want.items():
        assert shapes.get(k) == shape, f"{ckpt}: {k} is {shapes.get(k)}, expected {shape}"
    assert "lm_head.weight" not in shapes, "the head is tied"
    layers = {int(k.split(".")[3]) for k in shapes if k.startswith(lm + "layers.")}
    with_kv = {int(k.split(".")[3]) for k in shapes if k.startswith(lm + "layers.") and ".self_attn.k_proj." in k}
    conformer = {int(k.split(".")[3]) for k in shapes if k.startswith("model.audio_tower.conformer.")}
    assert layers == set(range(text_layers)), layers
    assert with_kv == set(range(text_layers - shared)), with_kv
    assert conformer == set(range(audio_layers)), conformer
    return {"tensors": len(shapes), "vision_tensors": sum(1 for k in shapes if k.startswith("model.vision_tower."))}


def build_gemma3n(out: Path, dtype: str, text_layers: int, audio_layers: int, shard: str) -> dict:
    """gemma-3n-E2B-it at the given depths, built by transformers' own Gemma3nForConditionalGeneration (its vision
    tower timm's MobileNetV5-300M encoder) in the stored dtype, every float parameter redrawn by randomize_blocked
    (seed 1235), saved by save_pretrained, with gemma3n_processor's processor and tokenizer."""
    import common
    import torch
    from transformers import Gemma3nForConditionalGeneration, GenerationConfig

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    timings = {}
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    t = time.perf_counter()
    cfg = gemma3n_config(text_layers, audio_layers)
    model = Gemma3nForConditionalGeneration._from_config(cfg, dtype=torch_dtype)
    timings["construct_s"] = time.perf_counter() - t
    t = time.perf_counter()
    randomize_blocked(model, common.SEED + 1)
    if dtype == "bf16":
        for c in [model.config] + [getattr(model.config, k) for k in model.config.sub_configs]:
            c.dtype = "bfloat16"
    timings["fill_s"] = time.perf_counter() - t
    assert model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
    ids = GEMMA3N_SPECIALS
    model.generation_config = GenerationConfig(bos_token_id=ids["<bos>"],
                                               eos_token_id=[ids["<eos>"], ids["<end_of_turn>"]],
                                               pad_token_id=ids["<pad>"], do_sample=False)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    t = time.perf_counter()
    model.save_pretrained(tmp, max_shard_size=shard)
    gemma3n_processor(gemma3n_tokenizer()).save_pretrained(tmp)
    timings["save_s"] = time.perf_counter() - t
    shared = model.config.text_config.num_kv_shared_layers
    tensors = check_gemma3n_tensors(tmp, text_layers, audio_layers, shared)

    def count(*prefixes):
        return sum(p.numel() for n, p in model.named_parameters() if n.startswith(prefixes))

    params = {"total": sum(p.numel() for p in model.parameters()), "text": count("model.language_model."),
              "audio": count("model.audio_tower.", "model.embed_audio."),
              "vision": count("model.vision_tower.", "model.embed_vision."),
              "text_per_layer_table": model.model.language_model.embed_tokens_per_layer.weight.numel()}
    files = {f.name: f.stat().st_size for f in sorted(tmp.iterdir())}
    tc = model.config.text_config
    info = {
        "generator": "tools/bench/gen_ckpt.py", "family": "gemma3n", "dtype": dtype, "text_layers": text_layers,
        "vision_blocks": audio_layers, "audio_layers": audio_layers, "num_kv_shared_layers": shared,
        "layer_types": tc.layer_types, "activation_sparsity_pattern": tc.activation_sparsity_pattern,
        "params": params, **tensors, "bytes": sum(files.values()), "files": files, "seed": common.SEED,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
    }
    (tmp / DONE).write_text(json.dumps(info, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return info


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
    # Molmo2-4B in f32 would take 19.4 GB while it is drawn: its bf16 form is built in bf16 (randomize_narrow).
    narrow = family == "molmo2" and dtype == "bf16"
    build_dtype = torch.bfloat16 if narrow else torch.float32
    if family in HUB_CONFIGS:
        # Built from the Hub form itself (as from_pretrained reads it), so the weights fit the config.json
        # written below.
        make, config_cls, model_cls = HUB_CONFIGS[family]
        hub = make(text_layers, vision_blocks, dtype)
        # A copy: from_dict rewrites what it is given in place into transformers 5's form (the rope fields,
        # Qwen3-VL's vision model_type, Molmo2's vit_config and vit_layers, which also trims its ViT to the
        # deepest layer the adapter reads).
        cfg = getattr(transformers, config_cls).from_dict(json.loads(json.dumps(hub)))
        model = getattr(transformers, model_cls)._from_config(cfg, dtype=build_dtype)
    else:
        model = Qwen2VLForConditionalGeneration._from_config(config(text_layers, vision_blocks), dtype=torch.float32)
    timings["construct_s"] = time.perf_counter() - t
    t = time.perf_counter()
    if narrow:
        randomize_narrow(model, common.SEED + 1)
    else:
        common.randomize(model)  # seed SEED + 1 = 1235
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
        # The stored dtype, named as the Hub's checkpoints name it (the family plugins read their
        # encoder weights in the dtype the config says).
        for cfg in [model.config] + [getattr(model.config, k) for k in model.config.sub_configs]:
            cfg.dtype = "bfloat16"
    timings["fill_s"] = time.perf_counter() - t
    tied = model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
    assert tied == (family != "molmo2"), f"lm_head tied: {tied}"  # the Qwen-VL 2B/3B tie it, Molmo2 does not
    eot, im_end = SPECIALS["<|endoftext|>"], SPECIALS["<|im_end|>"]
    model.generation_config = GenerationConfig(bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot,
                                               do_sample=False)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    t = time.perf_counter()
    model.save_pretrained(tmp, max_shard_size=shard)
    processor(tokenizer(chat_template(family), family), family).save_pretrained(tmp)
    if family == "molmo2":
        molmo2_fix_embedding_split(tmp, VOCAB)
        check_molmo2_tensors(tmp, text_layers, vision_blocks)
    if hub is not None:
        (tmp / "config.json").write_text(json.dumps(hub, indent=2) + "\n")
        check_reads_back(tmp, model.config)
    timings["save_s"] = time.perf_counter() - t
    vision_prefixes = ("model.visual.", "visual.", "model.vision_tower.", "model.multi_modal_projector.")
    params = {
        "total": sum(p.numel() for p in model.parameters()),
        # Molmo2's untied LM head counts as text (the Qwen-VL heads are the tied embedding, counted once).
        "text": sum(p.numel() for n, p in model.named_parameters()
                    if "language_model" in n or n.startswith("lm_head")),
        "vision": sum(p.numel() for n, p in model.named_parameters() if n.startswith(vision_prefixes)),
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


def check_molmo2_tensors(ckpt: Path, text_layers: int, vision_blocks: int) -> None:
    """The written Molmo2 checkpoint holds the Hub's tensor names and shapes: the split embedding, the untied head,
    `text_layers` decoder blocks and `vision_blocks` ViT resblocks (read from the safetensors headers)."""
    from safetensors import safe_open

    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    shapes = {}
    for name in sorted(set(index.values())):
        with safe_open(ckpt / name, "pt") as f:
            shapes.update({k: f.get_slice(k).get_shape() for k in f.keys()})
    assert set(shapes) == set(index), "the index and the shards disagree"
    want = {"model.transformer.wte.embedding": [VOCAB, 2560],
            "model.transformer.wte.new_embedding": [MOLMO2_ADDITIONAL_VOCAB, 2560], "lm_head.weight": [VOCAB, 2560],
            "model.vision_backbone.image_vit.positional_embedding": [729, 1152],
            "model.vision_backbone.image_vit.patch_embedding.weight": [1152, 588],
            "model.vision_backbone.image_pooling_2d.wq.weight": [1152, 2304],
            "model.vision_backbone.image_projector.w2.weight": [2560, 9728],
            "model.transformer.blocks.0.self_attn.att_proj.weight": [6144, 2560],
            "model.transformer.blocks.0.mlp.ff_proj.weight": [19456, 2560]}
    for k, shape in want.items():
        assert shapes.get(k) == shape, f"{ckpt}: {k} is {shapes.get(k)}, expected {shape}"
    blocks = {int(k.split(".")[3]) for k in shapes if k.startswith("model.transformer.blocks.")}
    resblocks = {int(k.split(".")[5]) for k in shapes if ".image_vit.transformer.resblocks." in k}
    assert blocks == set(range(text_layers)) and resblocks == set(range(vision_blocks)), (blocks, resblocks)


def check_reads_back(ckpt: Path, want) -> None:
    """transformers must read the written Hub-form config.json to the config the weights were drawn for."""
    from transformers import AutoConfig

    got = AutoConfig.from_pretrained(ckpt)
    # Bookkeeping that differs between a config built in memory and one read from a directory.
    skip = {"dtype", "_name_or_path", "transformers_version", "architectures"}
    for sub in want.sub_configs:
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
        if family == "molmo":
            info = build_molmo(out, dtype, text_layers, vision_blocks, shard)
        elif family == "youtu_vl":
            info = build_youtu_vl(out, dtype, text_layers, vision_blocks, shard)
        elif family == "gemma3n":
            info = build_gemma3n(out, dtype, text_layers, vision_blocks, shard)
        else:
            info = build(out, dtype, text_layers, vision_blocks, shard, family)
        print(f"gen_ckpt: {info['bytes'] / 1e9:.2f} GB, {info['params']['total']:,} parameters, "
              f"{info['timings_s']}", file=sys.stderr, flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=FAMILIES, default="qwen2_vl",
                    help="qwen2_vl: Qwen2-VL-2B's shape; qwen2_5_vl: Qwen2.5-VL-3B's; qwen3_vl: Qwen3-VL-2B's; "
                         "molmo2: Molmo2-4B's; molmo: Molmo-7B-D's; youtu_vl: Youtu-VL-4B's; "
                         "gemma3n: gemma-3n-E2B-it's (default %(default)s)")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--text-layers", type=int,
                    help="default: the real model's (28 qwen2_vl, 36 qwen2_5_vl, 28 qwen3_vl, 36 molmo2, 28 molmo, "
                         "40 youtu_vl, 30 gemma3n)")
    ap.add_argument("--vision-blocks", type=int,
                    help="default: the real model's (32; 24 qwen3_vl; 25 molmo2, the ViT layers stored and run; "
                         "23 molmo, the declared ViT layers; 27 youtu_vl; 12 gemma3n, its audio conformer layers)")
    ap.add_argument("--out", type=Path, help="default: ~/.cache/mlxcel/bench/qwen2vl-2b-<dtype>-L<n>-V<m> "
                                             "(qwen2_5_vl-3b-..., qwen3_vl-2b-..., molmo2-4b-..., "
                                             "molmo-7b-d-..., youtu_vl-4b-... and gemma3n-e2b-...-L<n>-A<m> "
                                             "for the other families)")
    ap.add_argument("--shard-size", default="2GB", help="max_shard_size for save_pretrained")
    ap.add_argument("--force", action="store_true", help="rebuild even when a complete checkpoint is there")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(ensure(args.dtype, args.text_layers, args.vision_blocks, args.out, args.force, args.shard_size,
                 args.family))
    return 0


if __name__ == "__main__":
    sys.exit(main())
