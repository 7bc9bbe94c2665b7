#!/usr/bin/env python3
"""mlxcel-host side by side with Hugging Face transformers (and mlx-vlm where it runs), on one checkpoint,
one image (one audio clip for Gemma 3n) and one prompt, with the same thread count, against the machine's
memory-bandwidth limit.

Run with the oracle venv's python (torch, transformers, mlx-vlm), after building the host and plugins
(`cargo build --release -p mlxcel-host` and `tools/build-plugins.sh`):

    PY=~/.cache/mlxcel/oracle-venv/bin/python
    $PY tools/bench/compare.py --quick                         # tiny f32 fixture, ratios only, well under a minute
    $PY tools/bench/compare.py --dtype f32 --text-layers 8 --vision-blocks 8 --reps 3 --bf16 --cold
    $PY tools/bench/compare.py --dtype f32 --reps 3            # full depth (28 text layers, 32 vision blocks)
    bash tools/bench/setup_llama_cpp.sh                        # once: llama.cpp, a third system for qwen2_vl
    $PY tools/bench/compare.py --dtype bf16 --reps 3 --new 32 --llama-quant Q4_K_M   # with llama.cpp bf16 and Q4_K_M
    $PY tools/bench/compare.py --family qwen2_5_vl --quick     # the same on the tiny Qwen2.5-VL fixture
    $PY tools/bench/compare.py --family qwen2_5_vl --dtype f32 --text-layers 8 --vision-blocks 8 --reps 3 --bf16 --cold
    $PY tools/bench/compare.py --family qwen2_5_vl --dtype bf16 --reps 2 --new 32   # full depth (36 text, 32 vision)
    $PY tools/bench/compare.py --family qwen3_vl --quick       # the same on the tiny Qwen3-VL fixture
    $PY tools/bench/compare.py --family qwen3_vl --dtype f32 --text-layers 2 --vision-blocks 2 --reps 1 --new 8 --streams 2
    $PY tools/bench/compare.py --family qwen3_vl --dtype bf16 --reps 2 --new 32     # full depth (28 text, 24 vision)
    $PY tools/bench/compare.py --family molmo2 --quick         # the same on the tiny Molmo2 fixture
    $PY tools/bench/compare.py --family molmo2 --dtype bf16 --text-layers 2 --vision-blocks 2 --reps 1 --new 8
    $PY tools/bench/compare.py --family molmo2 --dtype bf16 --reps 2 --new 32       # full depth (36 text, 25 vision)
    $PY tools/bench/compare.py --family molmo --quick          # the tiny Molmo (v1) fixture, against mlx-vlm
    $PY tools/bench/compare.py --family molmo --dtype bf16 --text-layers 4 --reps 1 --new 24   # 4 of 28 text layers
    $PY tools/bench/compare.py --family youtu_vl --quick       # the tiny Youtu-VL fixture, against mlx-vlm
    $PY tools/bench/compare.py --family youtu_vl --dtype bf16 --text-layers 4 --vision-blocks 4 --reps 2 --new 16
    $PY tools/bench/compare.py --family gemma3n --quick        # the tiny Gemma 3n fixture, an audio request
    $PY tools/bench/compare.py --family gemma3n --dtype bf16 --reps 2 --new 16      # full depth (30 text, 12 audio)

--family picks the checkpoint's shape: qwen2_vl (the default) is Qwen2-VL-2B-Instruct's, qwen2_5_vl is
Qwen2.5-VL-3B-Instruct's (config.json in the Hub's flat form; tied embeddings like the 2B; a windowed vision
tower with full attention in every 8th block), qwen3_vl is Qwen3-VL-2B-Instruct's (config.json in the Hub's
nested form; tied embeddings; q/k norms and 128-wide heads in the decoder; a patch-16 vision tower whose
DeepStack mergers feed the first text layers; its chat template adds no default system prompt, so the same
image and prompt make fewer rows), molmo2 is Molmo2-4B's (config.json in the Hub's remote-code form: vit_config,
the adapter's vit_layers, qkv_bias and layer_norm_eps; an untied LM head; q/k norms and 128-wide heads; a
SigLIP 2 ViT of which 25 of the 27 declared layers are stored and run, an attention-pooling adapter over 2x2
patches; the processor prepends <|endoftext|> as BOS to every prompt, and the 448x448 picture becomes 5 crops
and 792 prompt rows, so --capacity defaults to 1024 for it), molmo is Molmo-7B-D's (Molmo v1, MolmoForCausalLM:
a Qwen2-7B decoder of width 3584 with biased fused q/k/v and an untied head, a CLIP ViT-L/14 at 336x336 of which
22 of 23 layers run, 2x2 attention pooling and a SwiGLU projector; config.json in mlx-vlm's nested form, allenai's
tensor names; the processor cuts the 448x448 picture into 4 overlapping 336x336 crops plus a global one and puts
the image tokens before the "User: ... Assistant:" text, no BOS), youtu_vl is Youtu-VL-4B-Instruct's (Youtu-LLM's
decoder of width 2560 with multi-head latent attention, its cache the 512-wide latent and the 64-wide rotary key per
token, the 283386-row table tied to the head; a SigLIP2 ViT of width 1152 with 2-D rotary positions, windowed as
Qwen2.5-VL's with full attention in 4 of its 27 blocks, and a 2x2 patch merger; config.json flat as the fixture's,
the fused kv_b_proj; the 448x448 picture is 196 image tokens at patch 16). transformers has no Molmo v1 and no
Youtu-VL, so for molmo and youtu_vl the reference system is mlx-vlm 0.7.10 on mlx-cpu, its models/molmo and
models/youtu_vl (the column headed "mlx-vlm"; see the mlx-vlm worker below). Youtu-VL's image path is experimental
in mlxcel-host (its preprocessing has no reference, so its manifest qualifies none): mlxcel-host runs it with
--allow-unqualified, added for youtu_vl only. --text-layers and --vision-blocks default to the real model's depth, and
--quick takes the family's fixture (tests/fixtures/<family>). A --model directory must be of the family named
(its config's model_type is checked). Full-depth Qwen2.5-VL-3B is 3.75 B parameters: 15.0 GB in f32, 7.5 GB in
bf16, and gen_ckpt.py holds the f32 model (15 GB) while it builds either. Full-depth Qwen3-VL-2B is 2.13 B
parameters: 8.5 GB in f32, 4.3 GB in bf16, and gen_ckpt.py holds the f32 model (8.5 GB) while it builds either.
Full-depth Molmo2-4B is 4.85 B parameters: 19.4 GB in f32 (too much for a 24 GB machine: use --dtype bf16), 9.7
GB in bf16, which gen_ckpt.py builds in bf16 (9.7 GB held). Full-depth Molmo-7B-D is about 8.0 B parameters (16.0 GB
in bf16): beside mlx-vlm holding the same bf16 weights, on a 24 GB machine, run it reduced (--text-layers 4 is
2.43 B parameters, 4.86 GB, with the whole vision tower); gen_ckpt.py writes it tensor by tensor (about one 2 GB
shard held). mlx-vlm on mlx-cpu ran on one thread here (its CPU stream), and its image request took 861 s at 4
text layers, so the molmo reference's image request is timed on its first pass (see --mlx-warm-limit). Full-depth
Youtu-VL-4B as mlx-vlm's defaults build it is 5.34 B parameters (10.7 GB in bf16); --text-layers 4 --vision-blocks 4
is 1.24 B (2.48 GB, most of it the tied 283386-row table), which gen_ckpt.py writes tensor by tensor.

gemma3n is gemma-3n-E2B-it's shape (Gemma3nForConditionalGeneration, see gen_ckpt.py: a 30-layer AltUp decoder of
width 2048 with per-layer inputs and its last 10 layers KV-shared, a 262400-row tied table, the 12-layer USM conformer
audio encoder, and the MobileNetV5 vision tower that transformers loads and the host never reads), and its workload is
an **audio** request where the others have an image: a WAV clip (default a 4 s synthetic chirp, tools/oracle/common's
synthetic_audio, written once as ~/.cache/mlxcel/bench/inputs/synthetic-4s.wav; --audio for another), sent to
mlxcel-host as `generate --audio` and as an input_audio part before the text part, to transformers as
Gemma3nProcessor's audio=[samples / 32768] (as tools/oracle/gen_gemma3n.py feeds it), with the prompt "Transcribe this
audio.". Every clip is one block of 188 soft tokens (the processor's "\n\n<start_of_audio>" + 188 x
<audio_soft_token> + "<end_of_audio>\n\n"), whatever its length; the clip's own rows (one per 160 ms: 25 for 4 s)
fill the first of them, the audio padding embedding the rest. transformers' encoder share is its audio_tower's
forward through the soft-token projection, the padding rows and their scatter (to the language model's forward),
mlxcel-host's the audio request's TTFT minus a text request's of as many rows, as for images. The host serves Gemma
3n's audio only with --allow-unqualified (experimental in its manifest), which compare.py passes for it. --vision-blocks
counts the audio encoder's conformer layers for gemma3n; the tags and directories say A for them. The decode limit's
bytes are Gemma 3n's decoder read once a step (gemma3n_decode_bytes) and the cache of the 20 of 30 layers that keep
one. Full depth is 5.42 B parameters (10.8 GB in bf16; 4.44 B in the decoder, 2.01 B of them the per-layer table,
which a step reads one row of).

The checkpoint is generated by tools/bench/gen_ckpt.py under ~/.cache/mlxcel/bench/ when missing. Systems
run one at a time, never concurrently, alternating across repetitions (the first system of each repetition
alternates too); each repetition is a fresh process per system. Per system and repetition:

  mlxcel-host  `generate --image ... --json --ignore-eos` (decode tok/s for one stream, prefill, load),
               then `serve --slots S` driven over plain HTTP streaming: warm time to first token of the image
               request, of a text request with as many prompt rows (the difference is the encoder's share),
               one text stream alone (what a lone user of the S-slot server gets), and S concurrent text streams; the server runs with --encoder-cache-mb 0 --no-prefix-cache (warm
               is the compile cache: with its caches the image request sent again after the warm-up would skip
               the encoder and keep its prompt's rows, and the encoder's share came out negative);
  transformers one process: time to first token of the image request (processor included; encoder and LM
               prefill split by hooks on the vision tower; for gemma3n the audio request, split by hooks on
               the audio tower and the language model), one greedy stream, and one batched `generate`
               of S text prompts;
  mlx-vlm      for molmo, in place of transformers (the `hf` system): one process, loaded by mlx_vlm.utils's
               load_model as the oracle generator loads it, the stored dtype kept (bf16 weights compute in bf16
               on mlx-cpu), MolmoProcessor for the image request: time to first token of the image request
               (processor included; the vision tower, evaluated on its own, is the encoder share, the token
               embedding merge and LM prefill the rest), measured warm (a second pass) unless the first pass
               took longer than --mlx-warm-limit seconds, then measured on that first pass and flagged `warm`:
               false; one greedy stream continuing the image request through the prompt cache (mx.async_eval
               pipelined as generate_step is); no batched S-stream figure (mlx-vlm has no batched decode for it).
               For youtu_vl the same, with mlx-vlm's models/youtu_vl: mlx-vlm has no processor for Youtu-VL, so
               the image request is fed pixel_values and spatial_shapes made by tools/oracle/gen_youtu_vl.py's
               stand-in preprocessing (replicated as youtu_vl_preprocess, its per-side clamp for the tiny
               tower replaced by the area bounds the youtu_vl plugin applies; identical on the fixture's images)
               and its <|image_pad|> expanded to one per merged 2x2 unit, as gen_youtu_vl does.
  mlx-vlm      (--mlx) one greedy stream of the first text prompt (its image path is far too slow here);
               for qwen3_vl its own qwen3_vl model, which reads the generated checkpoint's Hub-form config
               as it is; for molmo2 its molmo2 model, which also reads the Hub form as it is but only at full
               depth: it cuts a declared ViT deeper than 25 layers to 25 and builds a shallower one whole, so
               a reduced tower (vit_config declaring 2 layers more than are stored) fails to load in it.
  llama.cpp    qwen2_vl only, when tools/bench/setup_llama_cpp.sh has built it (llama.cpp from the llama-cpp-python
               sdist on PyPI, native CPU flags; a default run without it skips it with a note, an explicit
               --systems ...,llama.cpp stops naming the script): the checkpoint converted once by llama.cpp's
               convert_hf_to_gguf.py at the run's dtype (f32 or bf16 GGUF) and its vision tower as an mmproj GGUF,
               under ~/.cache/mlxcel/bench/gguf/ (tools/bench/llama_cpp.py, which also says how the bench tokenizer
               is named to the converter); with --llama-quant TYPE also llama-quantize's TYPE (Q4_K_M, ...) of that
               GGUF, measured the same way. Per repetition two fresh llama-server processes (-t/-tb --threads, the
               prompt caches off): a 1-slot one for one greedy stream of --new tokens over the image request (the
               decode rate as `generate --image` gives mlxcel-host's; its peak RSS in the `generate` 1 slot row),
               and an S-slot one (-np S, capacity rows per slot) for the warm image request's time to first token,
               a text request of as many rows (the encoder's share is the difference, as for mlxcel-host) and S
               concurrent streams, all over /completion: text prompts as the same token ids the other systems run,
               the image request as the chat template's text with the image as multimodal data (its text ids and
               row count checked against the others' prompt ids). Weight repacking is llama.cpp's default (on;
               --llama-no-repack turns it off) and whether repacked buffers were used is recorded; its KV cache is
               its default f16. Ratios: mlxcel-host's advantage over llama.cpp, as over the reference.

With --bf16, the bf16 checkpoint of the same shape too (bf16 storage on both sides: transformers computes in
bf16, mlxcel-host keeps the weights bf16 and computes in f32, its qualified mode): the image request's warm
time to first token with its encoder and LM-prefill split, and one decode stream, alternating as above.

With --bf16-compute (--dtype bf16), mlxcel-host's experimental bf16 compute on the same checkpoint too
(`--compute bf16 --allow-unqualified`: bf16 activations, f32 accumulation, as transformers and llama.cpp compute
a bf16 checkpoint): the image request's time to first token and its encoder (for a family whose plugin offers a
bf16 encoder, BF16_ENCODERS; for the others its runs load no plugins and serve a text request with as many rows as
the image request instead), the LM prefill of that text request, one decode stream (`generate`) and the
server's lone, 2, S/2 and S streams, alternating with the main run's systems. Its figures stand beside the main run's transformers bf16 and
llama.cpp bf16 ones.

With --q4, the MLX community's 4-bit form of the bf16 checkpoint too, made by mlx-vlm's own converter
(`mlx_vlm.convert`, 4 bits in groups of 64, the vision tower left dense; cached under ~/.cache/mlxcel/bench/):
mlxcel-host on it (one decode stream, the S-stream aggregate, the image request, peak RSS) beside transformers
on the bf16 checkpoint (one stream and its batched S-stream `generate`), against the bandwidth limit of the
packed bytes (4-bit weights with their bf16 scales and biases, every linear and the tied head). qwen2_vl only:
the qwen2_5_vl and qwen3_vl manifests qualify no MLX form (no `forms.mlx_affine`), so mlxcel-host refuses the
image request on such a checkpoint, and --q4 with either family stops before running anything.

Decode rates are (tokens - 1) / (last token time - first token time) per stream; the aggregate rate counts
every token of every stream that lands in the window where all S streams are decoding (from the last
stream's first token to the first stream's last token). Peak RSS is each process's ru_maxrss (wait4), which
Linux starts at this script's own high-water mark (hundreds of MB): the checkpoint build and the bandwidth
measurement run in processes of their own so that it stays small.
`foreign_cores` is the CPU time other processes took during a run, in cores (0 = the machine was ours).

The limit beside each decode rate is the memory bandwidth measured here (tools/bench/membw.py, same
thread count, at the start and at the end of the run, the higher of the two) divided by the bytes one
decode step must read: every text weight once (the tied LM head is the whole embedding matrix) plus each
stream's KV cache at its mean context. For Qwen3-VL that is its decoder's weights with the q/k norms, the tied head once; the vision tower and its DeepStack mergers are read
only at prefill and are left out. For Youtu-VL, its latent-attention projections and a cache of 576 values per
layer and token (the latent and the rotary key), the tied head once.

Results: printed as a markdown table and written as JSON under ~/.cache/mlxcel/bench/results/. Ratios are
"mlxcel-host advantage": transformers time / mlxcel-host time, or mlxcel-host rate / transformers rate
(> 1: mlxcel-host is better); over llama.cpp the same (JSON: ratios_llama_cpp, each metric's "llama.cpp" figure, and
llama_cpp with its settings, files and --llama-quant variants). The script asserts nothing about absolute speed.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import http.client
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import llama_cpp  # noqa: E402  (tools/bench/llama_cpp.py: stdlib only at import)
import sse  # noqa: E402

HOST = REPO / "target" / "release" / "mlxcel-host"
PLUGINS = REPO / "target" / "plugins"
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "molmo2", "molmo", "youtu_vl", "gemma3n")
# --quick's tiny f32 checkpoint per family.
FIXTURES = {family: REPO / "tests" / "fixtures" / family for family in FAMILIES}
# transformers' class per family (AutoModelForImageTextToText resolves to the same ones).
HF_CLASSES = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
              "qwen3_vl": "Qwen3VLForConditionalGeneration", "molmo2": "Molmo2ForConditionalGeneration",
              "gemma3n": "Gemma3nForConditionalGeneration"}
# The reference system per family (the `hf` runs): transformers, or mlx-vlm on mlx-cpu where transformers has no
# implementation (Molmo v1, Youtu-VL).
REFERENCE = {"molmo": "mlx-vlm", "youtu_vl": "mlx-vlm"}
REF_WORKER = {"molmo": "molmo_mlx", "youtu_vl": "youtu_vl_mlx"}
# The families whose media capability the host serves only with --allow-unqualified (experimental: Youtu-VL's
# preprocessing has no reference, so its manifest qualifies no image path; Gemma 3n's audio is experimental until its
# Hub and bf16 forms are measured); mlxcel-host's generate and serve get the flag for them, and only for them.
UNQUALIFIED = {"youtu_vl", "gemma3n"}
# The families whose request carries an audio clip (a WAV file, sent as an input_audio part) instead of an image,
# and the prompt beside it.
AUDIO = {"gemma3n"}
AUDIO_PROMPT = "Transcribe this audio."
# The default clip: seconds of tools/oracle/common.synthetic_audio's chirp (200 Hz to 2 kHz and a faint 3 kHz tone),
# 16-bit mono at 16 kHz, written once under the bench directory.
AUDIO_SECONDS = 4.0
# The modules whose forward brackets the image encoder (transformers 5's names under model.model): the first one's
# forward pre-hook starts it, the last one's forward hook ends it. The Qwen-VL towers include their mergers;
# Molmo2's ViT is followed by its pooling adapter. Gemma 3n's audio encoder is its audio_tower, then embed_audio
# (the soft-token projection), the padding rows' embedding and their scatter into the prompt: it ends where the
# language model starts (ENCODER_ENDS_BEFORE: the last module's forward pre-hook ends it; embed_audio also runs
# before the tower, on the prompt's hard audio ids).
ENCODER_MODULES = {"qwen2_vl": ("visual", "visual"), "qwen2_5_vl": ("visual", "visual"),
                   "qwen3_vl": ("visual", "visual"), "molmo2": ("vision_tower", "multi_modal_projector"),
                   "gemma3n": ("audio_tower", "language_model")}
ENCODER_ENDS_BEFORE = {"gemma3n"}
# --capacity's default per family: the image request's prompt (792 rows for Molmo2's five crops of the default
# picture) and --new tokens must fit.
CAPACITY = {"qwen2_vl": 512, "qwen2_5_vl": 512, "qwen3_vl": 512, "molmo2": 1024, "molmo": 1024, "youtu_vl": 512,
            "gemma3n": 512}
# --chunk's default per family: mlxcel-host prefills a bidirectional image block in one call, so the chunk must
# hold it (Molmo2's image tokens, 785 for the default picture, are one block); the quick fixtures' blocks fit
# QUICK_CHUNK's.
CHUNK = {"qwen2_vl": 64, "qwen2_5_vl": 64, "qwen3_vl": 64, "molmo2": 1024, "molmo": 64, "youtu_vl": 64, "gemma3n": 64}
QUICK_CHUNK = {"qwen2_vl": 32, "qwen2_5_vl": 32, "qwen3_vl": 32, "molmo2": 64, "molmo": 32, "youtu_vl": 32,
               "gemma3n": 32}
HZ = os.sysconf("SC_CLK_TCK")

PROMPT = "Describe this image."
STREAM_PROMPT = "Write a short story about a lighthouse, number {}."


# ------------------------------------------------------------------------------------------------
# processes


def machine_busy() -> int:
    """Busy jiffies of the whole machine: user, nice, system, irq, softirq, steal (guest time is already
    inside user and nice)."""
    v = list(map(int, open("/proc/stat").readline().split()[1:]))
    return v[0] + v[1] + v[2] + v[5] + v[6] + v[7]


class Proc:
    """A child process whose peak RSS and CPU time come from wait4, with foreign CPU use alongside."""

    def __init__(self, cmd: list[str], env: dict | None = None, stdout=subprocess.PIPE, text_out: bool = True):
        self.cmd = cmd
        self.err = tempfile.TemporaryFile()
        self.busy0 = machine_busy()
        self.t0 = time.perf_counter()
        self.p = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=stdout, stderr=self.err,
                                  text=text_out)

    def wait(self) -> dict:
        _, status, ru = os.wait4(self.p.pid, 0)
        self.p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - self.t0
        own = ru.ru_utime + ru.ru_stime
        foreign = (machine_busy() - self.busy0) / HZ - own
        self.err.seek(0)
        return {
            "rc": self.p.returncode, "wall_s": wall, "peak_rss_bytes": ru.ru_maxrss * 1024, "cpu_s": own,
            "cores_used": own / wall if wall else 0.0, "foreign_cores": max(foreign, 0.0) / wall if wall else 0.0,
            "stderr": self.err.read().decode(errors="replace"),
        }

    def finish(self) -> tuple[str, dict]:
        out = self.p.stdout.read() if self.p.stdout else ""
        return out, self.wait()


def check(res: dict, what: str) -> None:
    if res["rc"] != 0:
        sys.exit(f"compare: {what} failed (exit {res['rc']}):\n{res['stderr'][-4000:]}")


def host_cmd(*args: str) -> list[str]:
    return [str(HOST), *args]


# The families whose plugin offers its encoder in bf16 compute (`EncoderCompute`); the others refuse it.
BF16_ENCODERS = {"qwen2_vl", "qwen2_5_vl"}


def bf16_text_only(args, bf16_compute: bool) -> bool:
    """Whether a bf16-compute run serves text only: its family's encoder computes in f32 only."""
    return bf16_compute and args.family not in BF16_ENCODERS


def device_args(args, bf16_compute: bool = False) -> list[str]:
    """The host's device flags. `bf16_compute`: the experimental bf16 compute, with the plugins only when the
    family offers a bf16 encoder (bf16_text_only)."""
    if bf16_compute:
        plugins = [] if bf16_text_only(args, True) else ["--plugins", str(PLUGINS)]
        return ["--driver", args.driver, *plugins, "--compute", "bf16", "--allow-unqualified"]
    unqualified = ["--allow-unqualified"] if args.family in UNQUALIFIED else []
    return ["--driver", args.driver, "--plugins", str(PLUGINS), *unqualified]


def ensure_checkpoint(dtype: str, text_layers: int, vision_blocks: int, family: str = "qwen2_vl") -> Path:
    """The generated checkpoint, built by gen_ckpt.py in a process of its own when missing: a child's peak RSS
    (wait4's ru_maxrss) starts at this process's high-water mark, which an in-process build would raise to the
    checkpoint's size, hiding every system's own peak under it."""
    import gen_ckpt

    out = gen_ckpt.default_dir(dtype, text_layers, vision_blocks, family)
    if not (out / gen_ckpt.DONE).exists():
        cmd = [sys.executable, str(Path(gen_ckpt.__file__)), "--dtype", dtype, "--text-layers", str(text_layers),
               "--vision-blocks", str(vision_blocks)]
        if family != "qwen2_vl":
            cmd += ["--family", family]
        subprocess.run(cmd, check=True)
    return out


# mlx-vlm's molmo TextConfig defaults (Molmo-7B-D's) under transformers' names, and Molmo's own names for them.
MOLMO_TEXT_DEFAULTS = {"hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
                       "num_hidden_layers": 28, "mlp_hidden_size": 37888, "vocab_size": 152064}
MOLMO_TEXT_NAMES = {"d_model": "hidden_size", "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads",
                    "n_layers": "num_hidden_layers"}


def text_config(config: dict) -> dict:
    """The text decoder's fields: transformers 5 nests them under text_config, as the Hub's Qwen3-VL configs do;
    the Hub's Qwen2-VL and Qwen2.5-VL configs (the generated Qwen2.5-VL checkpoint's among them) keep them flat
    beside vision_config. Molmo's (mlx-vlm's nested form) are renamed to transformers' names, mlx-vlm's defaults
    filling what is absent; its intermediate_size is the MLP width, half the fused up+gate rows
    (mlp_hidden_size), and its vocab the head's rows (embedding_size)."""
    if config.get("model_type") == "molmo":
        raw = config.get("text_config", config)
        tc = dict(MOLMO_TEXT_DEFAULTS)
        tc.update({MOLMO_TEXT_NAMES.get(k, k): v for k, v in raw.items()})
        tc["intermediate_size"] = tc["mlp_hidden_size"] // 2
        tc["vocab_size"] = raw.get("embedding_size") or tc["vocab_size"]
        return tc
    return config.get("text_config", config)


def head_dim(tc: dict) -> int:
    """Qwen3-VL and Molmo2 name their head width (128 in the 2B and the 4B, whatever the hidden size); Qwen2-VL's
    is hidden / heads."""
    return tc.get("head_dim") or tc["hidden_size"] // tc["num_attention_heads"]


def kv_values_per_row(tc: dict) -> int:
    """Values one layer's cache holds per token: K and V of every KV head, or, with multi-head latent attention
    (Youtu-VL's decoder: kv_lora_rank in the config), the compressed latent and the shared rotary key (512 + 64 in
    Youtu-VL-4B), which is what mlxcel-host's cache and mlx-vlm's hold."""
    if tc.get("kv_lora_rank"):
        return tc["kv_lora_rank"] + tc["qk_rope_head_dim"]
    return 2 * tc["num_key_value_heads"] * head_dim(tc)


def cache_layers(tc: dict) -> int:
    """The decoder layers that keep a cache: all of them, but for Gemma 3n's last num_kv_shared_layers, which reuse
    the cache of the last earlier layer of their kind (gemma-3n-E2B: 20 of 30)."""
    return tc["num_hidden_layers"] - (tc.get("num_kv_shared_layers") or 0)


def vision_depth(config: dict) -> int:
    """The vision blocks a checkpoint runs, as gen_ckpt.py's --vision-blocks counts them: the Qwen-VL towers'
    depth; Molmo2's ViT layers up to the deepest one its adapter reads (the Hub form's vit_config declares more,
    27 for 25 in Molmo2-4B; transformers 5's form, the --quick fixture's, has vision_config and
    vision_feature_layer)."""
    if config.get("model_type") == "molmo":
        return config.get("vision_config", {}).get("image_num_layers", 23)
    if config.get("model_type") == "youtu_vl":
        return config["vision_config"]["num_hidden_layers"]
    if config.get("model_type") == "gemma3n":
        # Its encoder is the audio one: the conformer's layers (gen_ckpt.py's --vision-blocks for gemma3n).
        return config["audio_config"]["conf_num_hidden_layers"]
    if config.get("model_type") != "molmo2":
        return config["vision_config"]["depth"]
    vit = config.get("vit_config") or config["vision_config"]
    adapter = config["adapter_config"]
    layers = adapter.get("vit_layers", adapter.get("vision_feature_layer"))
    return max(layer % vit["num_hidden_layers"] for layer in layers) + 1


# ------------------------------------------------------------------------------------------------
# the workload


class Workload:
    """What every system runs: one checkpoint, one image (or, for the AUDIO families, one WAV clip), one prompt, S
    text prompts."""

    def __init__(self, model: Path, image: Path, args):
        from transformers import AutoTokenizer

        self.model, self.image, self.args = model, image, args
        self.config = json.loads((model / "config.json").read_text())
        self.text = text_config(self.config)
        self.tok = AutoTokenizer.from_pretrained(model)
        # Molmo2's processor prepends the BOS (its eos, <|endoftext|>) to every prompt the chat template renders.
        self.bos_rows = 1 if self.config.get("model_type") == "molmo2" else 0
        self.stream_prompts = [STREAM_PROMPT.format(i + 1) for i in range(args.streams)]
        self.audio = args.family in AUDIO
        self.prompt = AUDIO_PROMPT if self.audio else PROMPT
        data = base64.b64encode(image.read_bytes()).decode()
        # The media part of the chat request, before the text part (as `generate --image/--audio` places it).
        self.media_part = ({"type": "input_audio", "input_audio": {"data": data, "format": "wav"}} if self.audio
                           else {"type": "image_url", "image_url": {"url": "data:image/png;base64," + data}})

    def text_rows(self, content: str) -> int:
        ids = self.tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                           tokenize=True)
        return len(ids if isinstance(ids, list) else ids["input_ids"]) + self.bos_rows

    def text_like(self, rows: int) -> str:
        """A text message whose prompt has exactly `rows` tokens (the image prompt's length), so the
        server's text-only time to first token is the LM prefill of as many rows."""
        words = max(rows - self.text_rows(self.prompt), 0)
        for _ in range(8):
            content = "a " * words + self.prompt
            n = self.text_rows(content)
            if n == rows:
                return content
            words += rows - n
        return content

    def spec(self) -> dict:
        a = self.args
        return {"model": str(self.model), "image": str(self.image), "audio": self.audio, "prompt": self.prompt,
                "new": a.new, "stream_prompts": self.stream_prompts, "threads": a.threads, "dtype": a.dtype,
                "family": a.family}


# ------------------------------------------------------------------------------------------------
# mlxcel-host


def mlxcel_generate(w: Workload, args, image: bool = True, new: int | None = None,
                    cache_dir: str | None = None, bf16_compute: bool = False, prompt: str | None = None) -> dict:
    cmd = host_cmd("generate", "--model", str(w.model), "--json", "--ignore-eos",
                   "--max-tokens", str(new or args.new), "--capacity", str(args.capacity), "--chunk", str(args.chunk),
                   *device_args(args, bf16_compute))
    if image:
        cmd += ["--audio" if w.audio else "--image", str(w.image)]
    cmd += ["--prompt", prompt or w.prompt]
    p = Proc(cmd, env={"MLXCEL_CACHE_DIR": cache_dir} if cache_dir else None)
    out, res = p.finish()
    check(res, "mlxcel-host generate")
    report = json.loads(out.strip().splitlines()[-1])
    t = report["timings"]
    return {
        "load_s": t["load_s"], "prefill_s": t["prefill_s"], "decode_tok_s": t["decode_tokens_per_s"],
        "prompt_ids": report["prompt_ids"], "tokens": report["tokens"], "compile_cache": report["compile_cache"],
        "wall_s": res["wall_s"], "peak_rss_bytes": res["peak_rss_bytes"], "cores_used": res["cores_used"],
        "foreign_cores": res["foreign_cores"],
    }


def sse_request(addr: str, body: dict, timeout: float = 1800) -> dict:
    """One streamed chat completion; the arrival time of each token's chunk (logprobs are requested, so
    every token has a chunk even when it decodes to no text), and each token with its logprob."""
    t0, stamps, tokens, usage = time.perf_counter(), [], [], None
    for t0, chunk in sse.post_stream(addr, "/v1/chat/completions", body, timeout):
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk.get("choices", []):
            lp = c.get("logprobs")
            if lp and lp.get("content"):
                stamps.extend([time.perf_counter()] * len(lp["content"]))
                tokens.extend([t.get("token"), t.get("logprob")] for t in lp["content"])
    return {"t0": t0, "stamps": stamps, "tokens": tokens, "usage": usage}


def chat_body(model: str, content, new: int) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": new,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
            "logprobs": True}


def window_rate(streams: list[dict]) -> dict:
    """Aggregate decode rate while every stream decodes, and the end-to-end output rate."""
    start = max(s["stamps"][0] for s in streams)
    end = min(s["stamps"][-1] for s in streams)
    inside = sum(1 for s in streams for t in s["stamps"] if start < t <= end)
    total = sum(len(s["stamps"]) for s in streams)
    wall = max(s["stamps"][-1] for s in streams) - min(s["t0"] for s in streams)
    return {"aggregate_tok_s": inside / (end - start) if end > start else None, "end_to_end_tok_s": total / wall,
            "tokens": total}


def mlxcel_serve(w: Workload, args, image_rows: int, prime: bool = False, streams: bool = True,
                 bf16_compute: bool = False) -> dict:
    """The server's warm time to first token for the image request and for a text request of as many
    rows, then (with `streams`) S concurrent text streams. `bf16_compute` in a family without a bf16 encoder
    serves text only: no image request, the text one warms the server up."""
    text_only = bf16_text_only(args, bf16_compute)
    # Without the encoder cache and the prefix cache: the warm-up sends the image request the measurement sends
    # again, so either cache would skip the encoder or the prefill being timed ("warm" here is the compile cache).
    cmd = host_cmd("serve", "--model", str(w.model), "--port", "0", "--slots", str(args.streams),
                   "--context", str(args.capacity), "--chunk", str(args.chunk), "--encoder-cache-mb", "0",
                   "--no-prefix-cache", *device_args(args, bf16_compute))
    p = Proc(cmd)
    addr = None
    for line in p.p.stdout:
        m = re.match(r"listening on http://(\S+)", line)
        if m:
            addr = m.group(1)
            break
    if addr is None:
        res = p.wait()
        check({**res, "rc": res["rc"] or 1}, "mlxcel-host serve")
    load_s = time.perf_counter() - p.t0
    threading.Thread(target=lambda: p.p.stdout.read(), daemon=True).start()
    try:
        model = json.loads(_get(addr, "/v1/models"))["data"][0]["id"]
        image_content = [w.media_part, {"type": "text", "text": w.prompt}]
        # The warm-up loads the encoder bucket (text only: warms the prefill up).
        sse_request(addr, chat_body(model, w.text_like(image_rows) if text_only else image_content, 1))
        if prime:
            p.p.send_signal(signal.SIGTERM)
            p.wait()
            return {}
        busy0, t0, cpu0 = machine_busy(), time.perf_counter(), _cpu_s(p.p.pid) + _self_cpu_s()
        ttft_image = None
        if not text_only:
            r = sse_request(addr, chat_body(model, image_content, 1))
            ttft_image = r["stamps"][0] - r["t0"]
        r = sse_request(addr, chat_body(model, w.text_like(image_rows), 1))
        ttft_text = r["stamps"][0] - r["t0"]
        if not streams:
            p.p.send_signal(signal.SIGTERM)
            res = p.wait()
            return {"load_s": load_s, "ttft_image_s": ttft_image, "ttft_text_same_rows_s": ttft_text,
                    "encoder_derived_s": ttft_image and ttft_image - ttft_text,
                    "peak_rss_bytes": res["peak_rss_bytes"]}
        # One stream alone on the S-slot server: what a lone user of a server gets (its decode steps run only
        # its own row), against `generate`'s one slot.
        r = sse_request(addr, chat_body(model, w.stream_prompts[0], args.new))
        if len(r["stamps"]) != args.new:
            raise RuntimeError(f"the lone stream did not yield {args.new} tokens")
        lone = (args.new - 1) / (r["stamps"][-1] - r["stamps"][0])

        def concurrent(n: int) -> dict:
            results: list[dict | None] = [None] * n

            def one(i):
                results[i] = sse_request(addr, chat_body(model, w.stream_prompts[i], args.new))

            ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            if any(r is None or len(r["stamps"]) != args.new for r in results):
                raise RuntimeError(f"a stream did not yield {args.new} tokens")
            return window_rate(results)

        # A few streams on the S-slot server: 2 and S/2 (their steps run a partial decode of that many rows).
        few = {n: concurrent(n)["aggregate_tok_s"] for n in sorted({2, args.streams // 2}) if 1 < n < args.streams}
        agg = concurrent(args.streams)
        wall = time.perf_counter() - t0
        # The client's own parsing counts as ours, not foreign.
        own = _cpu_s(p.p.pid) + _self_cpu_s() - cpu0
        foreign = ((machine_busy() - busy0) / HZ - own) / wall
    except BaseException:
        p.p.send_signal(signal.SIGTERM)
        p.wait()
        raise
    p.p.send_signal(signal.SIGTERM)
    res = p.wait()
    return {"load_s": load_s, "ttft_image_s": ttft_image, "ttft_text_same_rows_s": ttft_text,
            "encoder_derived_s": ttft_image and ttft_image - ttft_text, "streams": args.streams,
            "lone_stream_tok_s": lone,
            "two_streams_tok_s": few.get(2), "half_streams_tok_s": few.get(args.streams // 2),
            "aggregate_tok_s": agg["aggregate_tok_s"], "end_to_end_tok_s": agg["end_to_end_tok_s"],
            "peak_rss_bytes": res["peak_rss_bytes"], "foreign_cores": max(foreign, 0.0)}


def _cpu_s(pid: int) -> float:
    """CPU seconds a live process has used."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / HZ


def _self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _get(addr: str, path: str) -> str:
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("GET", path)
    body = conn.getresponse().read().decode()
    conn.close()
    return body


# ------------------------------------------------------------------------------------------------
# llama.cpp (tools/bench/llama_cpp.py: the GGUF files, llama-server, the measurement)

SYSTEMS = ("mlxcel", "hf", "llama.cpp")


def select_systems(args) -> list[str]:
    """--systems, or the default: mlxcel-host and the reference, and llama.cpp for its families outside --quick when it
    is built (else skipped with a note). An explicit llama.cpp that cannot run stops the script, naming the setup."""
    explicit = args.systems is not None
    if explicit:
        systems = [x.strip() for x in args.systems.split(",") if x.strip()]
        unknown = [x for x in systems if x not in SYSTEMS]
        if unknown or not systems:
            sys.exit(f"compare: --systems takes {', '.join(SYSTEMS)}, not {args.systems!r}")
    else:
        systems = ["mlxcel", "hf"]
        if not args.quick and args.family in llama_cpp.FAMILIES:
            systems.append("llama.cpp")
    if "llama.cpp" in systems:
        if args.family not in llama_cpp.FAMILIES:
            why = f"compare runs llama.cpp on {', '.join(llama_cpp.FAMILIES)} only, not {args.family}"
        else:
            why = llama_cpp.missing()
            if why:
                why += (f"; build it with `bash {llama_cpp.SETUP.relative_to(REPO)}` (llama.cpp from the "
                        f"llama-cpp-python sdist on PyPI)")
        if why:
            if explicit:
                sys.exit(f"compare: --systems names llama.cpp, but {why}")
            print(f"compare: note: llama.cpp skipped: {why}", file=sys.stderr, flush=True)
            systems.remove("llama.cpp")
    if args.llama_quant and "llama.cpp" not in systems:
        sys.exit("compare: --llama-quant measures llama.cpp, which this run does not include")
    return systems


def prepare_llama(w: Workload, args) -> dict[str, tuple[str, Path, Path]]:
    """The GGUF files llama.cpp runs, made once: the checkpoint at the run's dtype and its mmproj, then each
    --llama-quant type of it (with the same mmproj). Keyed by the runs' name: llama_cpp, llama_cpp_<TYPE>."""
    gguf = llama_cpp.ensure_gguf(w.model, args.dtype)
    mmproj = llama_cpp.ensure_mmproj(w.model, args.dtype)
    out = {"llama_cpp": (args.dtype, gguf, mmproj)}
    for q in [q.strip() for q in args.llama_quant.split(",") if q.strip()]:
        out[f"llama_cpp_{q}"] = (q, llama_cpp.ensure_quant(w.model, gguf, q, args.threads), mmproj)
    return out


# ------------------------------------------------------------------------------------------------
# transformers and mlx-vlm, each in its own process (this file with --worker)


def run_worker(kind: str, spec: dict) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({**spec, "launched": time.time()}, f)
    env = {"OMP_NUM_THREADS": str(spec["threads"]), "MKL_NUM_THREADS": str(spec["threads"]),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    p = Proc([sys.executable, __file__, "--worker", kind, "--spec", f.name], env=env)
    out, res = p.finish()
    os.unlink(f.name)
    check(res, f"the {kind} worker")
    line = [l for l in out.splitlines() if l.startswith("RESULT ")][-1]
    r = json.loads(line[7:])
    r.update(peak_rss_bytes=res["peak_rss_bytes"], wall_s=res["wall_s"], cores_used=res["cores_used"],
             foreign_cores=res["foreign_cores"])
    return r


def hf_worker(spec: dict) -> dict:
    import torch
    import transformers
    from PIL import Image
    from transformers import AutoProcessor, LogitsProcessor, LogitsProcessorList

    torch.set_num_threads(spec["threads"])
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[spec["dtype"]]
    cls = getattr(transformers, HF_CLASSES[spec["family"]])
    t = time.perf_counter()
    model = cls.from_pretrained(spec["model"], dtype=dtype).eval()
    load_s = time.perf_counter() - t
    proc = AutoProcessor.from_pretrained(spec["model"])
    n = spec["new"]

    class Stamp(LogitsProcessor):
        def __init__(self):
            self.t = []

        def __call__(self, input_ids, scores):
            self.t.append(time.perf_counter())
            return scores

    # The image encoder (model.model.visual in transformers 5 for the Qwen-VL families; Qwen3-VL's returns its
    # DeepStack features with the merged rows, so the hooks bracket them too; Molmo2's vision_tower through its
    # multi_modal_projector, the pooling adapter): its hooks split time to first token into encoder and LM
    # prefill.
    vis = {}
    first, last = (getattr(model.model, name) for name in ENCODER_MODULES[spec["family"]])
    first.register_forward_pre_hook(lambda m, i: vis.__setitem__("t0", time.perf_counter()))
    if spec["family"] in ENCODER_ENDS_BEFORE:
        def end(m, i):
            # The first call of `last` after the encoder started (Gemma 3n's language model, run once a forward).
            if "t0" in vis and "t1" not in vis:
                vis["t1"] = time.perf_counter()

        last.register_forward_pre_hook(end)
    else:
        last.register_forward_hook(lambda m, i, o: vis.__setitem__("t1", time.perf_counter()))

    def image_inputs():
        kind = "audio" if spec.get("audio") else "image"
        messages = [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": spec["prompt"]}]}]
        text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if spec.get("audio"):
            # As tools/oracle/gen_gemma3n.py feeds its clips: 16-bit samples / 32768, float32 (common.load_audio).
            clip = read_wav(Path(spec["image"]))
            inputs = proc(text=[text], audio=[clip], return_tensors="pt")
            # The features are f32; a bf16 audio tower takes them in its own dtype (transformers does not cast them).
            inputs["input_features"] = inputs["input_features"].to(dtype)
            return inputs
        with Image.open(spec["image"]) as im:
            img = im.convert("RGB")
        return proc(text=[text], images=[img], return_tensors="pt")

    @torch.inference_mode()
    def gen(inputs, new):
        st = Stamp()
        vis.clear()
        t0 = time.perf_counter()
        out = model.generate(**inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             logits_processor=LogitsProcessorList([st]))
        assert out.shape[1] - inputs["input_ids"].shape[1] == new
        r = {"t0": t0, "stamps": st.t, "ids": out[:, inputs["input_ids"].shape[1]:].tolist()}
        if "t0" in vis:
            r["vision_s"] = vis["t1"] - vis["t0"]
            r["vision_start"] = vis["t0"]
        return r

    # Cold: process start to the first token (imports, load, preprocessing, first generate).
    t = time.perf_counter()
    inputs = image_inputs()
    first = gen(inputs, 1)
    start_to_first = time.time() - spec["launched"]
    # Warm time to first token, preprocessing included.
    t = time.perf_counter()
    inputs = image_inputs()
    pre_s = time.perf_counter() - t
    r = gen(inputs, 1)
    ttft = r["stamps"][0] - t
    res = {"load_s": load_s, "start_to_first_token_s": start_to_first, "ttft_image_s": ttft,
           "preprocess_s": pre_s, "encoder_s": r["vision_s"], "lm_prefill_s": r["stamps"][0] - r["vision_start"]
           - r["vision_s"], "prompt_ids": inputs["input_ids"][0].tolist(), "first_tokens": first["ids"][0]}
    r = gen(inputs, n)
    res["decode_tok_s"] = (n - 1) / (r["stamps"][-1] - r["stamps"][0])
    res["tokens"] = r["ids"][0]
    if spec["stream_prompts"]:
        tok = proc.tokenizer
        tok.padding_side = "left"
        texts = [proc.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                          tokenize=False) for p in spec["stream_prompts"]]
        if spec["family"] == "molmo2":
            # What Molmo2's processor does to every prompt: its eos as BOS in front.
            texts = [tok.eos_token + t for t in texts]
        enc = tok(texts, return_tensors="pt", padding=True)
        batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
        if spec["family"] != "gemma3n":
            batch["mm_token_type_ids"] = torch.zeros_like(enc["input_ids"])
        lens = enc["attention_mask"].sum(1).tolist()
        r = gen(batch, n)
        s = len(texts)
        res.update(streams=s, stream_prompt_rows=lens, aggregate_tok_s=s * (n - 1) / (r["stamps"][-1] - r["stamps"][0]),
                   end_to_end_tok_s=s * n / (r["stamps"][-1] - r["t0"]))
    return res


def read_wav(path: Path):
    """A mono 16-bit WAV at 16 kHz as float32 samples / 32768, the form tools/oracle's Gemma 3n fixture feeds the
    feature extractor (common.load_audio)."""
    import wave

    import numpy as np

    with wave.open(str(path), "rb") as f:
        if (f.getnchannels(), f.getsampwidth(), f.getframerate()) != (1, 2, 16000):
            raise ValueError(f"{path}: not mono 16-bit 16 kHz")
        data = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
    return data.astype(np.float32) / 32768.0


def mlx_worker(spec: dict) -> dict:
    """mlx-vlm: one greedy stream of the first text prompt (mlx-cpu's image path takes minutes here)."""
    import mlx.core as mx
    from mlx_vlm.generate.ar import generate_step
    from mlx_vlm.utils import load_model
    from transformers import AutoTokenizer

    src = Path(spec["model"])
    dst = Path(tempfile.mkdtemp(prefix="mlx-ckpt-"))
    cfg = hub_form_config(json.loads((src / "config.json").read_text()))  # what mlx-vlm 0.7 reads
    for f in src.iterdir():
        if f.name != "config.json":
            (dst / f.name).symlink_to(f)
    (dst / "config.json").write_text(json.dumps(cfg))
    mx.set_default_device(mx.cpu)
    t = time.perf_counter()
    model = load_model(dst)
    if spec["dtype"] == "f32":
        model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    load_s = time.perf_counter() - t
    shutil.rmtree(dst)
    tok = AutoTokenizer.from_pretrained(spec["model"])
    text = tok.apply_chat_template([{"role": "user", "content": spec["stream_prompts"][0]}], add_generation_prompt=True,
                                   tokenize=False)
    ids = mx.array([tok(text)["input_ids"]])
    mask = mx.ones(ids.shape, dtype=mx.int32)
    n = spec["mlx_new"]
    rates = []
    for _ in range(2):
        for k in ("_position_ids", "_rope_deltas"):
            if hasattr(model.language_model, k):
                setattr(model.language_model, k, None)
        stamps, toks = [], []
        for tok_, _ in generate_step(ids, model, None, mask, max_tokens=n, temperature=0.0):
            stamps.append(time.perf_counter())
            toks.append(int(tok_))
            if len(stamps) == n:
                break
        rates.append((n - 1) / (stamps[-1] - stamps[0]))
    return {"load_s": load_s, "decode_tok_s": rates[-1], "tokens": toks, "new": n,
            "version": f"mlx-vlm {__import__('mlx_vlm').__version__} / mlx {mx.__version__}"}


def mlx_image_reference(spec: dict, model, load_s: float, prepare, encode, embed) -> dict:
    """mlx-vlm on mlx-cpu as the reference where transformers has none (Molmo v1, Youtu-VL): the image request's time
    to first token with its encoder / LM-prefill split, then one greedy stream continuing it through the prompt cache.
    `prepare()` is the preprocessing and tokenization (ids and the family's image inputs, evaluated), `encode(inputs)`
    the vision tower (the encoder share), `embed(ids, inputs, features)` the merged input embeddings (with the LM
    prefill, the rest). The LM prefill is mlx-vlm's generate_step's: every prompt row but the last through the cache
    with its logits never evaluated (its chunked prefill; the prompts here are within one 2048-row chunk), then the
    last row, so the head is computed for one row, not for every prompt row. The image request is timed warm (a
    second pass) unless the first took longer than spec["mlx_warm_limit"] seconds."""
    import mlx.core as mx
    import numpy as np
    from mlx_vlm.models.cache import make_prompt_cache

    lm = model.language_model

    def first_token():
        """Preprocessing, the vision tower, the merge and LM prefill to the first greedy token; returns the cache
        and the timings."""
        t0 = time.perf_counter()
        ids, inputs = prepare()
        tv0 = time.perf_counter()
        feats = encode(inputs)
        mx.eval(feats)
        tv1 = time.perf_counter()
        emb = embed(ids, inputs, feats)
        cache = make_prompt_cache(lm)
        if ids.shape[1] > 1:
            lm(ids[:, :-1], inputs_embeds=emb[:, :-1], cache=cache)  # the logits are dropped unevaluated
            mx.eval([c.state for c in cache])
        y = mx.argmax(lm(ids[:, -1:], inputs_embeds=emb[:, -1:], cache=cache).logits[0, -1], axis=-1)
        first = int(y.item())
        t1 = time.perf_counter()
        return {"ttft_image_s": t1 - t0, "preprocess_s": tv0 - t0, "encoder_s": tv1 - tv0, "lm_prefill_s": t1 - tv1,
                "prompt_ids": np.array(ids[0]).tolist(), "first": first, "cache": cache, "y": y}

    cold = first_token()
    start_to_first = time.time() - spec["launched"]
    warm = cold["ttft_image_s"] <= spec.get("mlx_warm_limit", 120)
    r = first_token() if warm else cold
    # One greedy stream through the cache, the next step queued (mx.async_eval) while the current token is read, as
    # mlx-vlm's generate_step does.
    n, cache = spec["new"], r["cache"]

    def step(y):
        return mx.argmax(lm(y.reshape(1, 1), cache=cache).logits[0, -1], axis=-1)

    y, stamps, toks = r["y"], [time.perf_counter()], [r["first"]]
    nxt = step(y)
    mx.async_eval(nxt)
    for i in range(n - 1):
        y = nxt
        if i < n - 2:
            nxt = step(y)
            mx.async_eval(nxt)
        toks.append(int(y.item()))
        stamps.append(time.perf_counter())
    res = {k: r[k] for k in ("ttft_image_s", "preprocess_s", "encoder_s", "lm_prefill_s", "prompt_ids")}
    res.update(load_s=load_s, start_to_first_token_s=start_to_first, warm=warm,
               cold_ttft_image_s=cold["ttft_image_s"], cold_encoder_s=cold["encoder_s"],
               cold_lm_prefill_s=cold["lm_prefill_s"], first_tokens=[cold["first"]],
               decode_tok_s=(n - 1) / (stamps[-1] - stamps[0]) if n > 1 else None, tokens=toks,
               version=f"mlx-vlm {__import__('mlx_vlm').__version__} / mlx {mx.__version__}")
    return res


def molmo_mlx_worker(spec: dict) -> dict:
    """mlx-vlm's Molmo (v1) on mlx-cpu, the reference where transformers has none (mlx_image_reference). Loaded as
    tools/oracle/gen_molmo.py's fixture is (mlx_vlm.utils.load_model, MolmoProcessor.from_pretrained); the stored
    dtype is kept (f32 for --quick's fixture, bf16 weights computing in bf16)."""
    import mlx.core as mx
    from mlx_vlm.models.molmo.processing_molmo import MolmoProcessor
    from mlx_vlm.utils import load_model
    from PIL import Image

    mx.set_default_device(mx.cpu)
    t = time.perf_counter()
    model = load_model(Path(spec["model"]))
    mx.eval(model.parameters())
    load_s = time.perf_counter() - t
    proc = MolmoProcessor.from_pretrained(spec["model"])
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": spec["prompt"]}]}]

    def prepare():
        text = proc.apply_chat_template(messages, add_generation_prompt=True)
        with Image.open(spec["image"]) as im:
            img = im.convert("RGB")
        inputs = proc(images=[img], text=text)
        mx.eval(inputs["input_ids"], inputs["pixel_values"], inputs["image_masks"], inputs["image_input_idx"])
        return inputs["input_ids"], inputs

    def encode(inputs):
        dtype = model.vision_tower.image_vit.patch_embedding.weight.dtype
        feats, _ = model.vision_tower(inputs["pixel_values"][None].astype(dtype), inputs["image_masks"][None])
        return feats

    def embed(ids, inputs, feats):
        return model.get_input_embeddings(ids, inputs["pixel_values"], image_input_idx=inputs["image_input_idx"],
                                          image_masks=inputs["image_masks"], cached_image_features=feats).inputs_embeds

    return mlx_image_reference(spec, model, load_s, prepare, encode, embed)


# The area bounds of Youtu-VL's stand-in resize in pixels: 4 to 1280 merged units of 32x32 pixels, the youtu_vl
# plugin's defaults for a checkpoint without a processor config (the bench checkpoints and the fixture have none).
YOUTU_VL_PIXELS = (4 * 32 * 32, 1280 * 32 * 32)


def youtu_vl_preprocess(img, patch: int = 16, merge: int = 2, bounds: tuple[int, int] = YOUTU_VL_PIXELS):
    """tools/oracle/gen_youtu_vl.py's `preprocess`, replicated: Youtu-VL has no reference processor (the real one is
    remote code, and mlx-vlm ships none), so both sides are fed the fixture's documented stand-in. One change, the
    target size: gen_youtu_vl rounds each side to a multiple of 32 pixels and clamps it to 64..128, a bound for its
    tiny tower; here the rounded size is bounded on its area instead, by Qwen-VL's smart_resize within `bounds`, as
    mlxcel-host's youtu_vl plugin does. The two agree wherever the clamp does not bite: on the fixture's images
    (youtu_vl_mlx_worker checks the replica against gen_youtu_vl.preprocess whenever the sizes agree) and not on the
    default 448x448 picture, which stays 448x448 here (28x28 patches, 196 image tokens). Then as gen_youtu_vl:
    Pillow bicubic, rescaled to [0, 1] and normalised to [-1, 1], 16-pixel patches flattened (row, column, channel)
    in merge order (each 2x2 block of patches consecutive). Returns [patches, 16*16*3] and the patch grid (h, w)."""
    import numpy as np
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    w, h = img.size
    th, tw = smart_resize(h, w, patch * merge, *bounds)
    x = np.asarray(img.resize((tw, th), Image.Resampling.BICUBIC), dtype=np.float32) / np.float32(255.0)
    x = (x - np.float32(0.5)) / np.float32(0.5)
    gh, gw = th // patch, tw // patch
    x = x.reshape(gh // merge, merge, patch, gw // merge, merge, patch, 3).transpose(0, 3, 1, 4, 2, 5, 6)
    return np.ascontiguousarray(x.reshape(gh * gw, patch * patch * 3)), (gh, gw)


def youtu_vl_mlx_worker(spec: dict) -> dict:
    """mlx-vlm's Youtu-VL (models/youtu_vl) on mlx-cpu, the reference where transformers has none
    (mlx_image_reference), loaded by mlx_vlm.utils.load_model (its sanitize splits the fused kv_b_proj), the stored
    dtype kept. mlx-vlm has no processor for it: the image request's pixel_values and spatial_shapes are made by
    youtu_vl_preprocess (the fixture's stand-in), its placeholder expanded to one <|image_pad|> per merged 2x2 unit
    and the prompt tokenized once without added specials, as tools/oracle/gen_youtu_vl.py's run_variant does; the
    features are merged at the <|image_pad|> rows by the model's own merge_input_ids_with_image_features."""
    import mlx.core as mx
    import numpy as np
    from mlx_vlm.utils import load_model
    from PIL import Image
    from transformers import AutoTokenizer

    sys.path.insert(0, str(REPO / "tools" / "oracle"))
    import gen_youtu_vl

    mx.set_default_device(mx.cpu)
    t = time.perf_counter()
    model = load_model(Path(spec["model"]))
    mx.eval(model.parameters())
    load_s = time.perf_counter() - t
    tok = AutoTokenizer.from_pretrained(spec["model"])
    cfg = model.config
    merge = cfg.vision_config.spatial_merge_size
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": spec["prompt"]}]}]
    with Image.open(spec["image"]) as im:
        img = im.convert("RGB")
    # The replica is the oracle's function wherever their sizes agree (the fixture's images).
    mine, ref = youtu_vl_preprocess(img, cfg.vision_config.patch_size, merge), gen_youtu_vl.preprocess(img)
    if mine[1] == ref[1] and not np.array_equal(mine[0], ref[0]):
        raise RuntimeError("youtu_vl_preprocess differs from gen_youtu_vl.preprocess at the same size")

    def prepare():
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        with Image.open(spec["image"]) as im:
            pixels, (gh, gw) = youtu_vl_preprocess(im.convert("RGB"), cfg.vision_config.patch_size, merge)
        head, tail = prompt.split("<|image_pad|>", 1)
        text = head + "<|image_pad|>" * (gh * gw // merge**2) + tail
        ids = mx.array([tok(text, add_special_tokens=False)["input_ids"]])
        inputs = {"pixel_values": mx.array(pixels[None]), "spatial_shapes": mx.array([[gh, gw]])}
        mx.eval(ids, inputs["pixel_values"], inputs["spatial_shapes"])
        return ids, inputs

    def encode(inputs):
        dtype = model.vision_tower.embeddings.patch_embedding.weight.dtype
        return model.vision_tower(inputs["pixel_values"].astype(dtype), inputs["spatial_shapes"])

    def embed(ids, inputs, feats):
        emb = model.language_model.model.embed_tokens(ids)
        return model.merge_input_ids_with_image_features(cfg.image_token_id, cfg.video_token_id, feats, emb, ids)

    return mlx_image_reference(spec, model, load_s, prepare, encode, embed)


def hub_form_config(cfg: dict) -> dict:
    """The Hub's pre-v5 form of a transformers 5 config: what mlx-vlm 0.7 reads. Qwen2-VL's is flat. A config
    already in the Hub's form (the generated Qwen2.5-VL checkpoint's: flat, its vision_config without a
    model_type, which mlx-vlm's qwen2_5_vl defaults to its own; the generated Qwen3-VL checkpoint's; the generated
    Molmo2 checkpoint's) is returned as it is. Qwen3-VL's stays nested, its text config with rope_theta and a
    rope_scaling of type default (mlx-vlm requires rope_theta there), its vision config under the old model_type
    qwen3_vl (mlx-vlm's vision tower refuses transformers 5's qwen3_vl_vision)."""
    cfg = json.loads(json.dumps(cfg))
    if "text_config" not in cfg or cfg.get("model_type") == "molmo2":
        # Molmo2's Hub form (vit_config, adapter_config, text_config) is what mlx-vlm's molmo2 reads.
        return cfg
    tc = cfg["text_config"]
    if cfg.get("model_type") == "qwen3_vl":
        if "rope_parameters" in tc:
            rp = dict(tc.pop("rope_parameters"))
            tc["rope_theta"] = rp.pop("rope_theta")
            tc["rope_scaling"] = rp
        tc.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
        cfg["vision_config"]["model_type"] = "qwen3_vl"
        return cfg
    rp = dict(tc.pop("rope_parameters"))
    tc["rope_theta"] = rp.pop("rope_theta")
    rp["type"] = "mrope"
    tc["rope_scaling"] = rp
    for k, v in tc.items():
        if k != "model_type":
            cfg.setdefault(k, v)
    cfg["vision_config"]["model_type"] = "qwen2_vl"
    return cfg


def quantize_worker(spec: dict) -> dict:
    """The MLX community's 4-bit form of a bench checkpoint, by mlx-vlm's own converter (in a process of its
    own: a child's peak RSS starts at this process's high-water mark)."""
    from mlx_vlm import convert

    src, out = Path(spec["model"]), Path(spec["out"])
    tmp = Path(tempfile.mkdtemp(prefix="mlx-src-"))
    for f in src.iterdir():
        if f.name != "config.json":
            (tmp / f.name).symlink_to(f)
    (tmp / "config.json").write_text(json.dumps(hub_form_config(json.loads((src / "config.json").read_text()))))
    convert(str(tmp), mlx_path=str(out), quantize=True, q_group_size=64, q_bits=4)
    shutil.rmtree(tmp)
    return {"out": str(out)}


def ensure_q4(bf16: Path) -> Path:
    """The 4-bit form of `bf16` (its directory name with `q4` for `bf16`), converted once."""
    out = bf16.parent / bf16.name.replace("-bf16-", "-q4-")
    done = out / "mlx-convert.done"
    if not done.exists():
        if out.exists():
            shutil.rmtree(out)
        run_worker("quantize", {"model": str(bf16), "out": str(out), "threads": 2})
        done.write_text(json.dumps({"from": str(bf16), "by": "mlx_vlm.convert q_bits=4 q_group_size=64"}))
    return out


# ------------------------------------------------------------------------------------------------
# limits


def decode_bytes(config: dict, dtype_bytes: int, context: float, streams: int = 1) -> float:
    """Bytes one decode step reads: every text weight once plus each stream's K and V over its context. The LM
    head is one vocab x hidden matrix read whole, whether tied or not: tied (Qwen2-VL-2B, Qwen2.5-VL-3B,
    Qwen3-VL-2B; the top-level tie_word_embeddings) it is the embedding matrix itself, counted once; untied
    (Molmo2-4B, its head over the base vocabulary), the embedding matrix beside it gives one row to the lookup,
    which is left out here as it is when tied. A layer is its q, k, v and o projections (Qwen2's q, k and v with
    biases; Qwen3-VL's biased only with attention_bias, Molmo2's q, k and v only with qkv_bias, their heads
    head_dim wide, plus a q and a k RMS norm of head_dim each), the gated MLP and two RMS norms; the final norm
    once. Youtu-VL's layers are multi-head latent attention instead (q_a and its RMS norm, q_b over nope + rope
    per head, kv_a_proj_with_mqa to the latent and the shared rotary key, the latent's RMS norm, the fused kv_b over
    nope + v per head, o from v per head), and its cache holds the latent and the rotary key per token
    (kv_values_per_row), tied head as the Qwen-VL 2B's."""
    tc = text_config(config)
    if config.get("model_type") == "gemma3n":
        return gemma3n_decode_bytes(tc, dtype_bytes, context, streams)
    h, i, layers = tc["hidden_size"], tc["intermediate_size"], tc["num_hidden_layers"]
    if tc.get("kv_lora_rank"):
        heads, r, c = tc["num_attention_heads"], tc["qk_rope_head_dim"], tc["kv_lora_rank"]
        nope, v = tc["qk_nope_head_dim"], tc["v_head_dim"]
        ql = tc.get("q_lora_rank")
        q = (h * ql + ql + ql * heads * (nope + r)) if ql else h * heads * (nope + r)
        per_layer = q + h * (c + r) + c + c * heads * (nope + v) + heads * v * h + 3 * h * i + 2 * h
        weights = (layers * per_layer + h + tc["vocab_size"] * h) * dtype_bytes
        return weights + layers * kv_values_per_row(tc) * dtype_bytes * context * streams
    heads, kv = tc["num_attention_heads"], tc["num_key_value_heads"]
    hd = head_dim(tc)
    q, kvw = heads * hd, kv * hd
    per_layer = h * q + 2 * h * kvw + q * h + 3 * h * i + 2 * h
    if config.get("model_type") == "qwen3_vl":
        per_layer += 2 * hd + ((q + 2 * kvw + h) if tc.get("attention_bias") else 0)
    elif config.get("model_type") == "molmo2":
        per_layer += 2 * hd + ((q + 2 * kvw) if tc.get("qkv_bias", tc.get("attention_bias")) else 0)
    else:
        per_layer += q + 2 * kvw
    head = tc["vocab_size"] * h
    weights = (layers * per_layer + h + head) * dtype_bytes
    kv_bytes = layers * 2 * kv * hd * dtype_bytes * context * streams
    return weights + kv_bytes


def gemma3n_decode_bytes(tc: dict, dtype_bytes: int, context: float, streams: int = 1) -> float:
    """decode_bytes for Gemma 3n's decoder. Each layer: q and o (8 heads of 256), k and v (2 KV heads) only in the
    layers that keep a cache (the KV-shared ones have none), the q and k norms (v's has no weight), the gated MLP of
    its own width (intermediate_size per layer), four RMS norms, AltUp (the 4 x 4 correction and 4 x 16 prediction
    coefficients, the 2048 x 4 router, its norm and the output scale), LAuReL (2048 x 64 in and out, its norm), the
    per-layer input's gate and projection (2048 x 256 each) and norm. Once a step: the tied head (the whole
    262400 x 2048 table), the per-layer projection (2048 x layers * 256) and its norm, the 3 + 3 AltUp projections
    (2048 x 2048 each), the final norm, and the token's rows of the two embedding tables (2048 and layers * 256). The
    audio tower and the multimodal embedders are left out (the encoder runs at prefill). The cache: K and V of the
    layers that keep one, each stream's context, a sliding layer's at most its window."""
    h, n, heads, kv, hd = (tc["hidden_size"], tc["num_hidden_layers"], tc["num_attention_heads"],
                           tc["num_key_value_heads"], head_dim(tc))
    inter = tc["intermediate_size"]
    inter = inter if isinstance(inter, list) else [inter] * n
    owners = cache_layers(tc)
    p, a, r = tc["hidden_size_per_layer_input"], tc["altup_num_inputs"], tc["laurel_rank"]
    weights = 0
    for i in range(n):
        weights += 2 * h * heads * hd + hd + (2 * h * kv * hd + hd if i < owners else 0) + 3 * h * inter[i] + 4 * h
        weights += a * a + a * a * a + h * a + 2 * h + 2 * h * r + h + 2 * h * p + h
    weights += tc["vocab_size"] * h + h * n * p + p + 2 * (a - 1) * h * h + h + h + n * p
    types = tc.get("layer_types") or ["full_attention"] * n
    window = tc.get("sliding_window") or context
    rows = sum(min(context, window) if t == "sliding_attention" else context for t in types[:owners])
    return weights * dtype_bytes + 2 * kv * hd * dtype_bytes * rows * streams


# ------------------------------------------------------------------------------------------------
# the run


def med(rows: list[dict], key: str):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def fmt(v, unit=""):
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.3g}{unit}" if abs(v) < 100 else f"{v:.0f}{unit}"
    return f"{v}{unit}"


def gib(b):
    return None if b is None else b / 2**30


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=FAMILIES, default="qwen2_vl",
                    help="the checkpoint's shape: Qwen2-VL-2B's, Qwen2.5-VL-3B's, Qwen3-VL-2B's, Molmo2-4B's, "
                         "Molmo-7B-D's (molmo, against mlx-vlm), Youtu-VL-4B's (youtu_vl, against mlx-vlm) or "
                         "gemma-3n-E2B's (gemma3n, an audio request) (default %(default)s)")
    ap.add_argument("--quick", action="store_true", help="the family's tiny f32 fixture; prints ratios only")
    ap.add_argument("--model", type=Path, help="a checkpoint directory (default: generated by gen_ckpt.py)")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--text-layers", type=int,
                    help="default: the real model's (28 qwen2_vl, 36 qwen2_5_vl, 28 qwen3_vl, 36 molmo2, 28 molmo, "
                         "40 youtu_vl, 30 gemma3n)")
    ap.add_argument("--vision-blocks", type=int,
                    help="default: the real model's (32; 24 qwen3_vl; 25 molmo2, the ViT layers stored and run; "
                         "23 molmo, the declared ViT layers; 27 youtu_vl; 12 gemma3n, its audio encoder's conformer "
                         "layers)")
    ap.add_argument("--image", type=Path, help="a png (default: a 448x448 synthetic picture, 256 image tokens; "
                                               "196 with qwen3_vl's 16-pixel patches; 5 crops and 792 prompt rows "
                                               "with molmo2)")
    ap.add_argument("--audio", type=Path, help="gemma3n: a mono 16-bit 16 kHz WAV (default: a 4 s synthetic chirp, "
                                               "common.synthetic_audio's; the fixture's 1 s chirp.wav with --quick)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--new", type=int, default=64, help="tokens generated per stream")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2, help="torch threads; mlxcel-host's local-task uses every core")
    ap.add_argument("--capacity", type=int, help="KV rows per slot (default 512; 1024 molmo2 and molmo)")
    ap.add_argument("--chunk", type=int, help="prefill chunk (default 64; 1024 molmo2)")
    ap.add_argument("--driver", default="local-task")
    ap.add_argument("--cold", action="store_true", help="also time process start to first token, empty vs warm cache")
    ap.add_argument("--bf16", action="store_true",
                    help="also the bf16 checkpoint of the same shape: image request and one decode stream")
    ap.add_argument("--bf16-compute", action="store_true",
                    help="also mlxcel-host's experimental bf16 compute on the --dtype bf16 checkpoint (text only: LM "
                         "prefill, 1 and S decode streams), beside the run's transformers and llama.cpp bf16 figures")
    ap.add_argument("--q4", action="store_true",
                    help="also mlxcel-host on the MLX 4-bit form of the bf16 checkpoint, beside transformers in bf16")
    ap.add_argument("--q4-only", action="store_true", help="--q4 without the --dtype checkpoint's own comparison")
    ap.add_argument("--mlx", action="store_true", help="also mlx-vlm's text-only decode")
    ap.add_argument("--mlx-new", type=int, default=16)
    ap.add_argument("--mlx-warm-limit", type=float, default=120,
                    help="molmo, youtu_vl: mlx-vlm's image request is timed warm (a second pass) only when its "
                         "first pass took at most this many seconds (default %(default)s)")
    ap.add_argument("--systems",
                    help="comma-separated, of mlxcel, hf and llama.cpp (default: mlxcel,hf, and llama.cpp too for "
                         "qwen2_vl outside --quick when tools/bench/setup_llama_cpp.sh has built it)")
    ap.add_argument("--llama-quant", default="",
                    help="llama.cpp: also these llama-quantize types of the run's GGUF, comma-separated (e.g. Q4_K_M), "
                         "measured as llama.cpp is, beside mlxcel-host at --dtype")
    ap.add_argument("--llama-no-repack", action="store_true",
                    help="llama.cpp: --no-repack (its CPU weight repacking is on by default)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help="results JSON (default under ~/.cache/mlxcel/bench/results/)")
    args = ap.parse_args()

    if args.worker:
        spec = json.loads(Path(args.spec).read_text())
        fn = {"hf": hf_worker, "mlx": mlx_worker, "quantize": quantize_worker, "molmo_mlx": molmo_mlx_worker,
              "youtu_vl_mlx": youtu_vl_mlx_worker}[args.worker]
        print("RESULT " + json.dumps(fn(spec)), flush=True)
        return 0

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gen_ckpt

    for need in (HOST, PLUGINS):
        if not need.exists():
            sys.exit(f"compare: {need} is missing: run `cargo build --release -p mlxcel-host` and tools/build-plugins.sh")
    if args.family in REFERENCE and (args.bf16 or args.mlx or args.cold):
        sys.exit(f"compare: --bf16, --mlx and --cold are not implemented for {args.family} (its reference is "
                 f"{REFERENCE[args.family]}, which runs in the main comparison)")
    if args.family in AUDIO and args.mlx:
        sys.exit(f"compare: --mlx is not implemented for {args.family}")
    if args.family in AUDIO:
        # The clip takes the image's place everywhere (Workload.image is the request's media file).
        if args.image is not None:
            sys.exit(f"compare: {args.family} takes --audio, not --image")
        args.image = args.audio
    if (args.q4 or args.q4_only) and args.family != "qwen2_vl":
        sys.exit(f"compare: --q4 runs the qwen2_vl family only: the {args.family} manifest qualifies no MLX "
                 f"affine form (no forms.mlx_affine), so mlxcel-host would refuse the image request on the 4-bit "
                 f"checkpoint")
    if args.bf16_compute and (args.dtype != "bf16" or args.quick or args.q4_only):
        sys.exit("compare: --bf16-compute runs beside the main comparison of a bf16 checkpoint: give --dtype bf16 "
                 "(not --quick or --q4-only)")
    args.capacity = CAPACITY[args.family] if args.capacity is None else args.capacity
    args.chunk = CHUNK[args.family] if args.chunk is None else args.chunk
    full_text, full_vision = gen_ckpt.FULL_DEPTH[args.family]
    args.text_layers = full_text if args.text_layers is None else args.text_layers
    args.vision_blocks = full_vision if args.vision_blocks is None else args.vision_blocks
    if args.quick:
        fixture = FIXTURES[args.family]
        args.model, args.dtype = args.model or fixture, "f32"
        args.image = args.image or fixture / "inputs" / ("chirp.wav" if args.family in AUDIO else "wide.png")
        # Enough tokens that all 8 streams are decoding at once for a while even on a loaded machine: with
        # 16 the tiny model finished the first stream before the last one started, which left the
        # aggregate window empty (no ratio; CI failed on it).
        args.new = min(args.new, 48)
        args.reps = 1 if args.reps == 3 else args.reps
        args.capacity = 128
        args.chunk = QUICK_CHUNK[args.family]
    model = args.model or ensure_checkpoint(args.dtype, args.text_layers, args.vision_blocks, args.family)
    bench = gen_ckpt.BENCH_DIR
    if args.image is None and args.family in AUDIO:
        import common  # tools/oracle, on the path through gen_ckpt

        name = f"synthetic-{AUDIO_SECONDS:g}s"
        args.image = bench / "inputs" / f"{name}.wav"
        if not args.image.exists():
            common.save_audio(common.synthetic_audio(AUDIO_SECONDS), bench, name)
    if args.image is None:
        import common  # tools/oracle, on the path through gen_ckpt

        args.image = bench / "inputs" / "synthetic-448.png"
        if not args.image.exists():
            args.image.parent.mkdir(parents=True, exist_ok=True)
            common.synthetic_image(448, 448).save(args.image, format="PNG")
    w = Workload(model, args.image, args)
    if w.config.get("model_type") != args.family:
        sys.exit(f"compare: {model} is a {w.config.get('model_type')!r} checkpoint, not --family {args.family}")
    spec = w.spec()
    if args.family in REFERENCE:
        spec["mlx_warm_limit"] = args.mlx_warm_limit
    systems = select_systems(args)
    say = (lambda *a: None) if args.quick else (lambda *a: print(*a, file=sys.stderr, flush=True))

    runs: dict[str, list[dict]] = {"mlxcel_generate": [], "mlxcel_serve": [], "hf": []}
    bw = None

    def membw() -> dict:
        # In a process of its own, like the checkpoint build: its arrays would raise this process's
        # high-water mark, which every child's peak RSS starts from.
        say("membw ...")
        script = Path(__file__).resolve().parent / "membw.py"
        out = subprocess.run([sys.executable, str(script), "--threads", str(args.threads)], check=True,
                             capture_output=True, text=True).stdout
        got = json.loads(out.strip().splitlines()[-1])
        say(json.dumps(got))
        return got

    if not args.quick:
        bw = membw()
    args.q4 = args.q4 or args.q4_only
    if "mlxcel" in systems and not args.q4_only:
        # Compile (or fetch from the cache) the 1-slot and the S-slot bundles and the encoder bucket, so no
        # repetition pays for a compile; the cold start is measured on its own (--cold).
        say("priming mlxcel-host's compile cache ...")
        g = mlxcel_generate(w, args, new=2)
        image_rows = len(g["prompt_ids"])
        mlxcel_serve(w, args, image_rows, prime=True)
    # The experimental bf16 compute runs as one more system of the alternation: the image request where the
    # family's encoder computes in bf16, else a text prompt with as many rows (the priming above counted them).
    bf16_compute = args.bf16_compute and "mlxcel" in systems
    if bf16_compute:
        say("priming mlxcel-host's compile cache, bf16 compute ...")
        bc_image = not bf16_text_only(args, True)
        bc_prompt = None if bc_image else w.text_like(image_rows)
        mlxcel_generate(w, args, image=bc_image, new=2, bf16_compute=True, prompt=bc_prompt)
        mlxcel_serve(w, args, image_rows, prime=True, bf16_compute=True)
        runs["mlxcel_bf16_compute_generate"], runs["mlxcel_bf16_compute_serve"] = [], []
    llama = None
    if "llama.cpp" in systems and not args.q4_only:
        llama = prepare_llama(w, args)
        say("llama.cpp: " + ", ".join(f"{label} {gguf.name} (+ {mmproj.name})"
                                      for label, gguf, mmproj in llama.values()))
    for rep in range(0 if args.q4_only else args.reps):
        alternated = systems + (["mlxcel-bf16-compute"] if bf16_compute else [])
        order = alternated if rep % 2 == 0 else alternated[::-1]
        for system in order:
            if system == "mlxcel-bf16-compute":
                say(f"rep {rep + 1}: mlxcel-host bf16 compute, generate and serve ...")
                runs["mlxcel_bf16_compute_generate"].append(
                    mlxcel_generate(w, args, image=bc_image, bf16_compute=True, prompt=bc_prompt))
                runs["mlxcel_bf16_compute_serve"].append(mlxcel_serve(w, args, image_rows, bf16_compute=True))
            elif system == "mlxcel":
                say(f"rep {rep + 1}: mlxcel-host generate ...")
                g = mlxcel_generate(w, args)
                runs["mlxcel_generate"].append(g)
                say(f"rep {rep + 1}: mlxcel-host serve ...")
                runs["mlxcel_serve"].append(mlxcel_serve(w, args, len(g["prompt_ids"])))
            elif system == "hf":
                say(f"rep {rep + 1}: {REFERENCE.get(args.family, 'transformers')} ...")
                if args.family in REFERENCE:
                    # A failing reference (mlx-vlm) must not lose mlxcel-host's figures: its error is recorded.
                    try:
                        runs["hf"].append(run_worker(REF_WORKER[args.family], spec))
                    except SystemExit as e:
                        say(f"{REFERENCE[args.family]} failed: {str(e)[-2000:]}")
                        runs.setdefault("reference_errors", []).append({"error": str(e)[-4000:]})
                else:
                    runs["hf"].append(run_worker("hf", spec))
            elif system == "llama.cpp":
                for key, (label, gguf, mmproj) in llama.items():
                    say(f"rep {rep + 1}: llama.cpp {label} ...")
                    runs.setdefault(key, []).append(llama_cpp.run(w, args, Proc, window_rate, gguf, mmproj,
                                                                  machine_busy, HZ))
            say(json.dumps({k: {kk: vv for kk, vv in v[-1].items()
                                if kk not in ("prompt_ids", "tokens", "stderr", "head_ids", "tail_ids", "system_info",
                                              "server_cmd", "timings_1_stream", "timings_image", "timings_text")}
                            for k, v in runs.items() if v}, default=str)[:3000])

    extra: dict[str, dict] = {}
    # --bf16 and --q4 compare mlxcel-host and transformers only.
    extra_systems = [x for x in systems if x != "llama.cpp"]
    if args.cold and "mlxcel" in systems:
        with tempfile.TemporaryDirectory(prefix="mlxcel-cold-") as cache:
            say("cold start: empty compile cache ...")
            cold = mlxcel_generate(w, args, new=1, cache_dir=cache)
            say("cold start: warm compile cache ...")
            warm = mlxcel_generate(w, args, new=1, cache_dir=cache)
        extra["cold"] = {"empty_cache": cold, "warm_cache": warm}
    if args.bf16:
        bf = ensure_checkpoint("bf16", w.text["num_hidden_layers"], vision_depth(w.config), args.family)
        wb = Workload(bf, args.image, args)
        runs_bf: dict[str, list[dict]] = {"mlxcel_generate": [], "mlxcel_serve": [], "hf": []}
        if "mlxcel" in systems:
            say("bf16: priming mlxcel-host's compile cache ...")
            g = mlxcel_generate(wb, args, new=2)
            mlxcel_serve(wb, args, len(g["prompt_ids"]), prime=True)
        for rep in range(args.reps):
            for system in (extra_systems if rep % 2 == 0 else extra_systems[::-1]):
                say(f"bf16 rep {rep + 1}: {system} ...")
                if system == "mlxcel":
                    g = mlxcel_generate(wb, args)
                    runs_bf["mlxcel_generate"].append(g)
                    runs_bf["mlxcel_serve"].append(mlxcel_serve(wb, args, len(g["prompt_ids"]), streams=False))
                elif system == "hf":
                    runs_bf["hf"].append(run_worker("hf", {**wb.spec(), "dtype": "bf16", "stream_prompts": []}))
        extra["bf16"] = {"model": str(bf), **runs_bf}
    if args.q4:
        bf = ensure_checkpoint("bf16", w.text["num_hidden_layers"], vision_depth(w.config), args.family)
        q4 = ensure_q4(bf)
        wb, wq = Workload(bf, args.image, args), Workload(q4, args.image, args)
        runs_q: dict[str, list[dict]] = {"mlxcel_generate": [], "mlxcel_serve": [], "hf": []}
        if "mlxcel" in systems:
            say("q4: priming mlxcel-host's compile cache ...")
            g = mlxcel_generate(wq, args, new=2)
            mlxcel_serve(wq, args, len(g["prompt_ids"]), prime=True)
        for rep in range(args.reps):
            for system in (extra_systems if rep % 2 == 0 else extra_systems[::-1]):
                say(f"q4 rep {rep + 1}: {system} ...")
                if system == "mlxcel":
                    g = mlxcel_generate(wq, args)
                    runs_q["mlxcel_generate"].append(g)
                    runs_q["mlxcel_serve"].append(mlxcel_serve(wq, args, len(g["prompt_ids"])))
                elif system == "hf":
                    runs_q["hf"].append(run_worker("hf", {**wb.spec(), "dtype": "bf16"}))
        extra["q4"] = {"model": str(q4), "bf16_model": str(bf), **runs_q}
    if args.mlx:
        say("mlx-vlm ...")
        try:
            extra["mlx"] = run_worker("mlx", {**spec, "mlx_new": args.mlx_new})
        except SystemExit as e:
            extra["mlx"] = {"error": str(e)[-2000:]}

    if args.family in REFERENCE and runs["hf"]:
        extra["reference"] = {"system": REFERENCE[args.family], "runs": [
            {k: r.get(k) for k in ("version", "warm", "cold_ttft_image_s", "cold_encoder_s", "cold_lm_prefill_s",
                                   "preprocess_s", "start_to_first_token_s", "load_s")} for r in runs["hf"]]}
    extra["hf_runs"] = runs["hf"]
    if bw:
        # The bandwidth a shared host leaves a guest moves within minutes (on an AMD Zen 4 guest, reads of 35
        # and of 65 GB/s ten minutes apart), so it is measured again at the end, and each limit uses the
        # higher of the two: a limit is a bound the rates under it may not pass.
        end = membw()
        bw = {**{k: max(v, end[k]) if k.endswith("_GBps") else v for k, v in bw.items()},
              "start": {k: v for k, v in bw.items() if k.endswith("_GBps")},
              "end": {k: v for k, v in end.items() if k.endswith("_GBps")}}
    report = summarize(w, args, runs, extra, bw)
    del extra["hf_runs"]
    if args.quick:
        print_ratios(report)
        # CI runs this: the pipeline must work end to end on both sides; the ratios are never asserted.
        missing = [k for k in QUICK_RATIOS if k not in report["ratios"]
                   and not (args.family in REFERENCE and k == "aggregate_tok_s")]
        if missing or report["same_prompt_ids"] is not True:
            print(f"compare --quick: failed: ratios missing {missing}, same prompt ids "
                  f"{report['same_prompt_ids']}", file=sys.stderr)
            return 1
    else:
        print_table(report)
        out = args.out or bench / "results" / f"compare-{report['tag']}-{report['started']}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({**report, "runs": runs, "extra": extra}, indent=1, default=str))
        print(f"\nresults: {out}")
    return 0


# What --quick must produce: every system ran every phase.
QUICK_RATIOS = ("ttft_image_s", "encoder_s", "lm_prefill_s", "decode_1_tok_s", "aggregate_tok_s", "peak_rss_bytes")


def summarize(w: Workload, args, runs: dict, extra: dict, bw: dict | None) -> dict:
    import gen_ckpt

    g, s, h = runs["mlxcel_generate"], runs["mlxcel_serve"], runs["hf"]
    ll = runs.get("llama_cpp", [])
    dtype_bytes = 4 if args.dtype == "f32" else 2
    tc = w.text
    rows_image = (len(g[0]["prompt_ids"]) if g else (len(h[0]["prompt_ids"]) if h else 0)) or (
        ll[0]["prompt_rows_image"] if ll else 0)
    same_prompt = None
    if g and h:
        same_prompt = g[0]["prompt_ids"] == h[0]["prompt_ids"]
    m = {
        "ttft_image_s": (med(s, "ttft_image_s"), med(h, "ttft_image_s"), "lower"),
        "ttft_generate_prefill_s": (med(g, "prefill_s"), None, "lower"),
        "encoder_s": (med(s, "encoder_derived_s"), med(h, "encoder_s"), "lower"),
        "lm_prefill_s": (med(s, "ttft_text_same_rows_s"), med(h, "lm_prefill_s"), "lower"),
        "decode_1_tok_s": (med(g, "decode_tok_s"), med(h, "decode_tok_s"), "higher"),
        "decode_1_on_server_tok_s": (med(s, "lone_stream_tok_s"), med(h, "decode_tok_s"), "higher"),
        "decode_2_on_server_tok_s": (med(s, "two_streams_tok_s"), None, "higher"),
        "decode_half_on_server_tok_s": (med(s, "half_streams_tok_s"), None, "higher"),
        "aggregate_tok_s": (med(s, "aggregate_tok_s"), med(h, "aggregate_tok_s"), "higher"),
        "end_to_end_tok_s": (med(s, "end_to_end_tok_s"), med(h, "end_to_end_tok_s"), "higher"),
        "peak_rss_1_stream_bytes": (med(g, "peak_rss_bytes"), None, "lower"),
        "peak_rss_bytes": (med(s, "peak_rss_bytes"), med(h, "peak_rss_bytes"), "lower"),
        "load_s": (med(g, "load_s"), med(h, "load_s"), "lower"),
    }
    ratios = {}
    for k, (a, b, better) in m.items():
        if a and b:
            ratios[k] = b / a if better == "lower" else a / b
    llama = summarize_llama(runs, m, g, h)
    limits = {}
    if bw:
        ctx1 = rows_image + args.new / 2
        ctx8 = statistics.fmean(w.text_rows(p) for p in w.stream_prompts) + args.new / 2
        b1 = decode_bytes(w.config, dtype_bytes, ctx1)
        b8 = decode_bytes(w.config, dtype_bytes, ctx8, args.streams)
        for kernel in ("copy", "read", "triad"):
            gbps = bw[f"{kernel}_GBps"] * 1e9
            limits[kernel] = {"decode_1_tok_s": gbps / b1, "aggregate_tok_s": args.streams * gbps / b8}
        limits["bytes_per_step_1"] = b1
        limits["bytes_per_step_streams"] = b8
    ckpt = sum(f.stat().st_size for f in w.model.glob("*.safetensors"))
    kv = cache_layers(tc) * kv_values_per_row(tc) * dtype_bytes * args.capacity
    return {
        "reference": REFERENCE.get(args.family, "transformers"),
        # qwen2_vl's tags are unprefixed, as before there were families.
        "tag": ("" if args.family == "qwen2_vl" else f"{args.family}-")
        + f"{args.dtype}-L{tc['num_hidden_layers']}-{gen_ckpt.ENCODER_LETTER.get(args.family, 'V')}"
        + f"{vision_depth(w.config)}",
        "media": "audio" if w.audio else "image",
        "family": args.family,
        "started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ"),
        "command": " ".join([Path(sys.executable).name, "tools/bench/compare.py", *sys.argv[1:]]),
        "model": str(w.model), "image": str(w.image), "dtype": args.dtype, "reps": args.reps, "new": args.new,
        "streams": args.streams, "threads": args.threads, "driver": args.driver, "capacity": args.capacity,
        "chunk": args.chunk, "prompt_rows_image": rows_image, "same_prompt_ids": same_prompt,
        "checkpoint_bytes": ckpt, "kv_bytes_per_slot": kv,
        "metrics": {k: {"mlxcel": a, "hf": b, **({"llama.cpp": llama["metrics"][k]} if llama else {}), "better": c}
                    for k, (a, b, c) in m.items()}, "ratios": ratios,
        # mlxcel-host's advantage over llama.cpp at the run's dtype (as "ratios" is over the reference), and the
        # llama.cpp runs' settings, GGUF files, prompt check and --llama-quant variants.
        **({"ratios_llama_cpp": llama["ratios"], "llama_cpp": llama["info"]} if llama else {}),
        "bandwidth": bw, "limits": limits,
        # The floor under every child's peak RSS (see the module docstring).
        "harness_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "foreign_cores_max": max([r.get("foreign_cores", 0) for v in runs.values() for r in v] or [0]),
        "cores_used_mlxcel_generate": med(g, "cores_used"), "cores_used_hf": med(h, "cores_used"),
        "summary_extra": summarize_extra(extra, w, args, bw),
        **({"bf16_compute": summarize_bf16_compute(runs, m, llama)}
           if runs.get("mlxcel_bf16_compute_generate") else {}),
    }


# The experimental bf16 compute's metrics (text only), each beside the main run's figure for the same metric.
BF16_COMPUTE_KEYS = ("ttft_image_s", "encoder_s", "lm_prefill_s", "ttft_generate_prefill_s", "decode_1_tok_s",
                     "decode_1_on_server_tok_s", "decode_2_on_server_tok_s", "decode_half_on_server_tok_s",
                     "aggregate_tok_s", "end_to_end_tok_s", "peak_rss_1_stream_bytes", "peak_rss_bytes")


def summarize_bf16_compute(runs: dict, m: dict, llama: dict | None) -> dict:
    """mlxcel-host's bf16 compute beside the main run's mlxcel-host (f32 compute), reference and llama.cpp, with its
    advantage over each (the main run's convention)."""
    g, s = runs["mlxcel_bf16_compute_generate"], runs["mlxcel_bf16_compute_serve"]
    mine = {
        "ttft_image_s": med(s, "ttft_image_s"), "encoder_s": med(s, "encoder_derived_s"),
        "lm_prefill_s": med(s, "ttft_text_same_rows_s"), "ttft_generate_prefill_s": med(g, "prefill_s"),
        "decode_1_tok_s": med(g, "decode_tok_s"), "decode_1_on_server_tok_s": med(s, "lone_stream_tok_s"),
        "decode_2_on_server_tok_s": med(s, "two_streams_tok_s"),
        "decode_half_on_server_tok_s": med(s, "half_streams_tok_s"), "aggregate_tok_s": med(s, "aggregate_tok_s"),
        "end_to_end_tok_s": med(s, "end_to_end_tok_s"), "peak_rss_1_stream_bytes": med(g, "peak_rss_bytes"),
        "peak_rss_bytes": med(s, "peak_rss_bytes"),
    }
    out = {}
    for k in BF16_COMPUTE_KEYS:
        a, better = mine[k], m[k][2]
        others = {"mlxcel_f32_compute": m[k][0], "hf": m[k][1],
                  "llama.cpp": llama["metrics"].get(k) if llama else None}
        out[k] = {"mlxcel_bf16_compute": a, **others,
                  "advantage": {name: (b / a if better == "lower" else a / b) if a and b else None
                                for name, b in others.items()}}
    return {"metrics": out, "prompt_rows": len(g[0]["prompt_ids"]), "image": mine["ttft_image_s"] is not None,
            "foreign_cores_max": max([r.get("foreign_cores", 0) for r in g + s] or [0])}


# mlxcel-host's metrics and llama.cpp's figure for each (tools/bench/llama_cpp.py's run()).
LLAMA_KEYS = {"ttft_image_s": "ttft_image_s", "encoder_s": "encoder_derived_s", "lm_prefill_s": "ttft_text_same_rows_s",
              "decode_1_tok_s": "decode_tok_s", "aggregate_tok_s": "aggregate_tok_s",
              "end_to_end_tok_s": "end_to_end_tok_s", "peak_rss_1_stream_bytes": "peak_rss_1_stream_bytes",
              "peak_rss_bytes": "peak_rss_bytes", "load_s": "load_s"}


def summarize_llama(runs: dict, m: dict, g: list, h: list) -> dict | None:
    """llama.cpp's medians beside mlxcel-host's, and mlxcel-host's advantage over them (the same convention as over
    the reference), for the run's dtype (runs["llama_cpp"]) and each --llama-quant type (runs["llama_cpp_<TYPE>"])."""
    variants = {k: v for k, v in runs.items() if (k == "llama_cpp" or k.startswith("llama_cpp_")) and v}
    if not variants:
        return None
    ref = g[0]["prompt_ids"] if g else (h[0]["prompt_ids"] if h else None)

    def one(rows: list[dict]) -> dict:
        vals = {k: med(rows, LLAMA_KEYS[k]) if k in LLAMA_KEYS else None for k in m}
        ratios = {}
        for k, (a, _, better) in m.items():
            b = vals[k]
            if a and b:
                ratios[k] = b / a if better == "lower" else a / b
        first = rows[0]
        info = {"gguf": first["gguf"], "mmproj": first["mmproj"], "prompt_rows_image": first["prompt_rows_image"],
                "same_prompt_ids": llama_cpp.same_prompt(ref, first),
                # Its greedy tokens over the image request against mlxcel-host's `generate` (else transformers').
                "same_tokens": (first["tokens"] == (g[0]["tokens"] if g else h[0]["tokens"])) if (g or h) else None,
                "repack": first["repack"],
                "repack_used": any(r["repack_used"] for r in rows), "buffers": first.get("buffers"),
                "kv_types": first.get("kv_types"), "flash_attn": first.get("flash_attn"),
                "system_info": first.get("system_info"), "server_cmd": first["server_cmd"],
                "server_timings_image_1_stream": first.get("timings_1_stream")}
        return {"metrics": vals, "ratios": ratios, "info": info}

    main = one(variants["llama_cpp"]) if "llama_cpp" in variants else {"metrics": dict.fromkeys(m), "ratios": {},
                                                                        "info": {}}
    quants = {k[len("llama_cpp_"):]: one(v) for k, v in variants.items() if k != "llama_cpp"}
    setup = llama_cpp.setup_info() or {}
    main["info"].update(setup={k: setup.get(k) for k in ("llama_cpp_python", "source", "cmake_flags", "march_native",
                                                         "build_seconds")},
                        aggregate="llama-server -np S, S concurrent /completion streams (token-id prompts)",
                        quants=quants)
    return main


def summarize_extra(extra: dict, w: Workload, args, bw) -> dict:
    out = {}
    if "cold" in extra:
        c, wm = extra["cold"]["empty_cache"], extra["cold"]["warm_cache"]
        out["cold"] = {"hf_start_to_first_token_s": med(extra.get("hf_runs", []), "start_to_first_token_s"),
                       "empty_cache_start_to_first_token_s": c["wall_s"], "empty_cache_load_s": c["load_s"],
                       "empty_cache_prefill_s": c["prefill_s"], "warm_cache_start_to_first_token_s": wm["wall_s"],
                       "warm_cache_load_s": wm["load_s"], "warm_cache_prefill_s": wm["prefill_s"]}
    if "bf16" in extra:
        e = extra["bf16"]
        g, s, h = e["mlxcel_generate"], e["mlxcel_serve"], e["hf"]
        rows = {
            "ttft_image_s": (med(s, "ttft_image_s"), med(h, "ttft_image_s"), "lower"),
            "encoder_s": (med(s, "encoder_derived_s"), med(h, "encoder_s"), "lower"),
            "lm_prefill_s": (med(s, "ttft_text_same_rows_s"), med(h, "lm_prefill_s"), "lower"),
            "decode_1_tok_s": (med(g, "decode_tok_s"), med(h, "decode_tok_s"), "higher"),
            "peak_rss_1_stream_bytes": (med(g, "peak_rss_bytes"), med(h, "peak_rss_bytes"), "lower"),
        }
        out["bf16"] = {
            "model": e["model"],
            "same_prompt_ids": g[0]["prompt_ids"] == h[0]["prompt_ids"] if g and h else None,
            "metrics": {k: {"mlxcel": a, "hf": b, "ratio": (b / a if c == "lower" else a / b) if a and b else None}
                        for k, (a, b, c) in rows.items()},
        }
        if bw and g:
            ctx = len(g[0]["prompt_ids"]) + args.new / 2
            out["bf16"]["limits"] = {k: bw[f"{k}_GBps"] * 1e9 / decode_bytes(w.config, 2, ctx)
                                     for k in ("copy", "read")}
    if "q4" in extra:
        e = extra["q4"]
        g, s, h = e["mlxcel_generate"], e["mlxcel_serve"], e["hf"]
        rows = {
            "ttft_image_s": (med(s, "ttft_image_s"), med(h, "ttft_image_s"), "lower"),
            "lm_prefill_s": (med(s, "ttft_text_same_rows_s"), med(h, "lm_prefill_s"), "lower"),
            "decode_1_tok_s": (med(g, "decode_tok_s"), med(h, "decode_tok_s"), "higher"),
            "decode_1_on_server_tok_s": (med(s, "lone_stream_tok_s"), med(h, "decode_tok_s"), "higher"),
            "decode_2_on_server_tok_s": (med(s, "two_streams_tok_s"), None, "higher"),
            "decode_half_on_server_tok_s": (med(s, "half_streams_tok_s"), None, "higher"),
            "aggregate_tok_s": (med(s, "aggregate_tok_s"), med(h, "aggregate_tok_s"), "higher"),
            "peak_rss_1_stream_bytes": (med(g, "peak_rss_bytes"), None, "lower"),
            "peak_rss_bytes": (med(s, "peak_rss_bytes"), med(h, "peak_rss_bytes"), "lower"),
        }
        q4_dir = Path(e["model"])
        out["q4"] = {
            "model": e["model"], "bf16_model": e["bf16_model"],
            "checkpoint_bytes": sum(f.stat().st_size for f in q4_dir.glob("*.safetensors")),
            "same_prompt_ids": g[0]["prompt_ids"] == h[0]["prompt_ids"] if g and h else None,
            "metrics": {k: {"mlxcel": a, "hf": b, "ratio": (b / a if c == "lower" else a / b) if a and b else None}
                        for k, (a, b, c) in rows.items()},
        }
        if bw and g:
            # 4 bits per weight plus a bf16 scale and bias per 64: 0.5625 bytes; the KV cache is f32.
            ctx1 = len(g[0]["prompt_ids"]) + args.new / 2
            ctx8 = statistics.fmean(w.text_rows(p) for p in w.stream_prompts) + args.new / 2
            packed = 0.5 + 2 * 2 / 64
            weights = decode_bytes(w.config, packed, 0)
            kv1 = decode_bytes(w.config, 4, ctx1) - decode_bytes(w.config, 4, 0)
            kv8 = decode_bytes(w.config, 4, ctx8, args.streams) - decode_bytes(w.config, 4, 0, args.streams)
            out["q4"]["limits"] = {
                k: {"decode_1_tok_s": bw[f"{k}_GBps"] * 1e9 / (weights + kv1),
                    "aggregate_tok_s": args.streams * bw[f"{k}_GBps"] * 1e9 / (weights + kv8)}
                for k in ("copy", "read")}
            out["q4"]["bytes_per_step_1"] = weights + kv1
    if "mlx" in extra:
        out["mlx"] = {k: v for k, v in extra["mlx"].items() if k != "tokens"}
    if "reference" in extra:
        out["reference"] = extra["reference"]
    return out


LABELS = {
    "ttft_image_s": "time to first token, {media} request, warm (s)",
    "ttft_generate_prefill_s": "`generate` prefill_s, {media} (s; encoder bucket load included)",
    "encoder_s": "  of which {media} encoder (s)",
    "lm_prefill_s": "  of which LM prefill (s)",
    "decode_1_tok_s": "decode, 1 stream (tok/s)",
    "decode_1_on_server_tok_s": "decode, 1 stream alone on the {streams}-slot server (tok/s; vs transformers' 1 stream)",
    "decode_2_on_server_tok_s": "decode, aggregate of 2 streams on the {streams}-slot server (tok/s)",
    "decode_half_on_server_tok_s": "decode, aggregate of {half} streams on the {streams}-slot server (tok/s)",
    "aggregate_tok_s": "decode, aggregate of {streams} streams (tok/s)",
    "end_to_end_tok_s": "output rate, {streams} streams incl. prefill (tok/s)",
    "peak_rss_1_stream_bytes": "peak RSS, `generate` 1 slot (GiB)",
    "peak_rss_bytes": "peak RSS, {streams}-slot server / HF process (GiB)",
    "load_s": "load (s)",
}


def print_table(r: dict) -> None:
    print(f"\n{r['tag']}: {r['model']}, {r.get('media', 'image')} {r['image']} ({r['prompt_rows_image']} prompt rows), "
          f"{r['new']} new tokens, {r['reps']} reps (medians), threads {r['threads']}, driver {r['driver']}, "
          f"same prompt ids: {r['same_prompt_ids']}, max foreign load {r['foreign_cores_max']:.2f} cores\n")
    rows = []
    for k, v in r["metrics"].items():
        lim = None
        if r["limits"] and k in ("decode_1_tok_s", "aggregate_tok_s"):
            lim = (r["limits"]["copy"][k], r["limits"]["read"][k])
        rows.append((LABELS[k].format(streams=r["streams"], half=r["streams"] // 2, media=r.get("media", "image")), k, v["mlxcel"], v["hf"],
                     r["ratios"].get(k), lim))
    extra = []
    if r.get("llama_cpp"):
        li = r["llama_cpp"]
        extra.append((f"llama.cpp {r['dtype']}", {k: v.get("llama.cpp") for k, v in r["metrics"].items()},
                      r["ratios_llama_cpp"]))
        for q, qv in li["quants"].items():
            extra.append((f"llama.cpp {q}", qv["metrics"], qv["ratios"]))
    print_rows(rows, r.get("reference", "transformers"), extra)
    if r.get("llama_cpp"):
        li = r["llama_cpp"]
        print(f"\nllama.cpp (llama-cpp-python {li['setup'].get('llama_cpp_python')}'s vendor tree, -march=native): "
              f"{li['gguf']} + {Path(li['mmproj']).name}; image prompt {li['prompt_rows_image']} rows, same prompt "
              f"ids: {li['same_prompt_ids']}, same greedy tokens: {li['same_tokens']}; repacking "
              f"{'on' if li['repack'] else 'off (--no-repack)'}, used: "
              f"{li['repack_used']} (weight buffers {li['buffers']}); KV cache {li['kv_types']}; flash attention "
              f"{li['flash_attn']}; aggregate: {li['aggregate']}")
        for q, qv in li["quants"].items():
            qi = qv["info"]
            print(f"llama.cpp {q}: {qi['gguf']}, same prompt ids: {qi['same_prompt_ids']}, same greedy tokens: "
                  f"{qi['same_tokens']}, repacking used: "
                  f"{qi['repack_used']} (weight buffers {qi['buffers']})")
    if r["bandwidth"]:
        print(f"\nbandwidth ({r['threads']} threads): {json.dumps(r['bandwidth'])}")
        print(f"bytes per decode step: 1 stream {r['limits']['bytes_per_step_1'] / 1e9:.3f} GB, "
              f"{r['streams']} streams {r['limits']['bytes_per_step_streams'] / 1e9:.3f} GB")
    print(f"checkpoint {r['checkpoint_bytes'] / 2**30:.2f} GiB, KV per slot {r['kv_bytes_per_slot'] / 2**20:.1f} MiB, "
          f"this script's own peak RSS (the floor of every figure) {gib(r['harness_peak_rss_bytes']):.2f} GiB")
    if r.get("bf16_compute"):
        print_bf16_compute(r)
    for k, v in r["summary_extra"].items():
        if k == "bf16":
            print_bf16(v, r)
        elif k == "q4":
            print_q4(v, r)
        else:
            print(f"{k}: {json.dumps(v, default=str)}")


def print_bf16(v: dict, r: dict) -> None:
    print(f"\nbf16 checkpoint {v['model']} (bf16 storage: transformers computes in bf16, mlxcel-host in f32 over "
          f"the bf16 weights), same prompt ids: {v['same_prompt_ids']}\n")
    rows = []
    for k, m in v["metrics"].items():
        lim = (v["limits"]["copy"], v["limits"]["read"]) if k == "decode_1_tok_s" and v.get("limits") else None
        label = "peak RSS, `generate` 1 slot / HF process (GiB)" if k == "peak_rss_1_stream_bytes" else LABELS[k]
        rows.append((label.format(streams=r["streams"], half=r["streams"] // 2, media=r.get("media", "image")), k, m["mlxcel"], m["hf"],
                     m["ratio"], lim))
    print_rows(rows)


def print_bf16_compute(r: dict) -> None:
    v = r["bf16_compute"]
    served = (f"the image request ({v['prompt_rows']} rows), its encoder in bf16" if v.get("image") else
              f"text only, no plugins: a text prompt of {v['prompt_rows']} rows")
    print(f"\nmlxcel-host's experimental bf16 compute (--compute bf16 --allow-unqualified) on the same checkpoint, "
          f"{served}, beside this run's figures; advantage (x, > 1 = bf16 compute better)\n")
    ref = r.get("reference", "transformers")
    print(f"| metric | mlxcel-host bf16 compute | mlxcel-host f32 compute | {ref} | llama.cpp {r['dtype']} | "
          f"over f32 compute | over {ref} | over llama.cpp | bandwidth limit (copy / read) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k, row in v["metrics"].items():
        scale = gib if "bytes" in k else (lambda x: x)
        lim = ""
        if r["limits"] and k in ("decode_1_tok_s", "aggregate_tok_s"):
            lim = f"{r['limits']['copy'][k]:.3g} / {r['limits']['read'][k]:.3g}"
        label = {"lm_prefill_s": "LM prefill: server's time to first token, text (s)",
                 "ttft_generate_prefill_s": "`generate` prefill_s, " + ("image request" if v.get("image") else "text")
                                            + " (s)"}.get(k) or LABELS[k]
        label = label.format(streams=r["streams"], half=r["streams"] // 2, media=r.get("media", "image"))
        adv = row["advantage"]
        print(f"| {label} | {fmt(scale(row['mlxcel_bf16_compute']))} | {fmt(scale(row['mlxcel_f32_compute']))} | "
              f"{fmt(scale(row['hf']))} | {fmt(scale(row['llama.cpp']))} | {fmt(adv['mlxcel_f32_compute'])} | "
              f"{fmt(adv['hf'])} | {fmt(adv['llama.cpp'])} | {lim} |")


def print_q4(v: dict, r: dict) -> None:
    print(f"\nMLX 4-bit form {v['model']} ({v['checkpoint_bytes'] / 2**30:.2f} GiB; mlx_vlm.convert, groups of 64) "
          f"under mlxcel-host, beside transformers in bf16 on {v['bf16_model']}, same prompt ids: "
          f"{v['same_prompt_ids']}\n")
    rows = []
    for k, m in v["metrics"].items():
        lim = None
        if v.get("limits") and k in ("decode_1_tok_s", "aggregate_tok_s"):
            lim = (v["limits"]["copy"][k], v["limits"]["read"][k])
        rows.append((LABELS[k].format(streams=r["streams"], half=r["streams"] // 2, media=r.get("media", "image")), k, m["mlxcel"], m["hf"],
                     m["ratio"], lim))
    print_rows(rows)
    if v.get("bytes_per_step_1"):
        print(f"packed bytes per decode step, 1 stream: {v['bytes_per_step_1'] / 1e9:.3f} GB")


def print_rows(rows: list[tuple], reference: str = "transformers", extra: list[tuple] = ()) -> None:
    """A markdown table of (label, metric key, mlxcel-host, reference, ratio, (copy, read) limit or None), and per
    `extra` system (name, its value per metric key, mlxcel-host's advantage per metric key) two more columns."""
    head = "".join(f" {name} | advantage over {name} (x) |" for name, _, _ in extra)
    print(f"| metric | mlxcel-host | {reference} | mlxcel-host advantage (x) |{head} bandwidth limit (copy / read) |")
    print("|---|---|---|---|" + "---|---|" * len(extra) + "---|")
    for label, k, a, b, ratio, lim in rows:
        scale = gib if "bytes" in k else (lambda x: x)
        cols = "".join(f" {fmt(scale(vals.get(k)))} | {fmt(ratios.get(k))} |" for _, vals, ratios in extra)
        limit = f"{lim[0]:.3g} / {lim[1]:.3g}" if lim else ""
        print(f"| {label} | {fmt(scale(a))} | {fmt(scale(b))} | {fmt(ratio)} |{cols} {limit} |")


def print_ratios(r: dict) -> None:
    print(f"compare --quick ({r['model']}): mlxcel-host advantage over {r.get('reference', 'transformers')} "
          f"(x, > 1 = mlxcel-host better); "
          f"same prompt ids: {r['same_prompt_ids']}")
    for k, v in r["ratios"].items():
        label = LABELS[k].format(streams=r["streams"], half=r["streams"] // 2, media=r.get("media", "image")).split(" (")[0]
        print(f"  {label:<48} {v:.2f}")
    if r.get("ratios_llama_cpp"):
        print(f"  mlxcel-host advantage over llama.cpp {r['dtype']} (same prompt ids: "
              f"{r['llama_cpp']['same_prompt_ids']}):")
        for k, v in r["ratios_llama_cpp"].items():
            label = LABELS[k].format(streams=r["streams"], half=r["streams"] // 2, media=r.get("media", "image")).split(" (")[0]
            print(f"  {label:<48} {v:.2f}")


if __name__ == "__main__":
    sys.exit(main())
