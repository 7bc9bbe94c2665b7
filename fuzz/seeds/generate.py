#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (fuzz/seeds/<target>/) from the repository's own fixtures.

    python3 fuzz/seeds/generate.py

Each seed is the files its target reads, joined by a NUL byte (see fuzz/src/lib.rs), taken from
tests/fixtures/ and manifests/, or built here when no fixture is small enough (safetensors files,
the preprocessing header). Seeds stay small (a few KB; the two tokenizers about 15 KB): libFuzzer
grows its own corpus from them in fuzz/corpus/, which is not committed. The directory is replaced
as a whole, so a seed dropped here disappears.

Standard library only.
"""

from __future__ import annotations

import base64
import json
import shutil
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/fixtures"
SEEDS = Path(__file__).resolve().parent

# Family, fixture directory, processor config file name.
FAMILIES = [
    ("gemma3", "gemma3", "processor_config.json"),
    ("llava", "llava", "processor_config.json"),
    ("molmo", "molmo", "preprocessor_config.json"),
    ("molmo2", "molmo2", "processor_config.json"),
    ("qwen2_vl", "qwen2_vl", "processor_config.json"),
    ("qwen2_5_vl", "qwen2_5_vl", "processor_config.json"),
    ("qwen3_vl", "qwen3_vl", "processor_config.json"),
    ("youtu_vl", "youtu_vl", ""),
]

IMAGES = [
    "png_rgb8.png", "png_rgba8.png", "png_palette_trns.png", "png_l1.png", "png_l16.png", "png_la8.png",
    "png_palette_short.png", "png_exif_6.png", "png_exif_after_idat_3.png", "png_xmp_8.png",
    "png_raw_profile_5.png", "refused_png_bomb.png", "refused_apng.png",
    "jpeg_420_37x23.jpg", "jpeg_422_37x23.jpg", "jpeg_444_37x23.jpg", "jpeg_grey.jpg", "jpeg_exif_6.jpg",
    "jpeg_exif_1_xmp_8.jpg", "jpeg_progressive_420.jpg", "jpeg_grey_progressive.jpg", "jpeg_corrupt_scan.jpg",
    "jpeg_extraneous_bytes.jpg", "refused_jpeg_cmyk.jpg", "refused_jpeg_bomb.jpg",
    "webp_lossy_37x23.webp", "webp_lossless.webp", "webp_lossless_alpha.webp", "webp_exif_6.webp",
    "webp_xmp_3.webp", "refused_webp_bomb.webp",
    "gif_palette.gif", "gif_local_palette.gif", "gif_no_palette.gif", "gif_offset_frame_transparent.gif",
    "gif_frame_past_screen.gif", "gif_short_palette.gif", "refused_gif_bomb.gif",
]


def joined(*parts: bytes) -> bytes:
    return b"\0".join(parts)


def safetensors(tensors: list[tuple[str, str, list[int]]], metadata: dict | None = None, pad: int = 0) -> bytes:
    sizes = {"F32": 4, "BF16": 2, "F16": 2, "U32": 4, "I64": 8, "U8": 1, "BOOL": 1, "F8_E4M3": 1}
    header: dict = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape in tensors:
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode() + b" " * pad
    return struct.pack("<Q", len(text)) + text + bytes(offset)


def preprocess_seed(mode: int, payload: bytes, max_pixels: int = 0, min_pixels: int = 0) -> bytes:
    return bytes([mode]) + struct.pack("<II", max_pixels, min_pixels) + payload


def rgb(width: int, height: int, pixels: bytes) -> bytes:
    return struct.pack("<HH", width - 1, height - 1) + pixels


def main() -> None:
    seeds: dict[str, dict[str, bytes]] = {}
    read = lambda rel: (FIXTURES / rel).read_bytes()  # noqa: E731

    seeds["media_decode"] = {name: read(f"images/{name}") for name in IMAGES}

    # The audio family: its config, and its clips (with and without a limit) for the WAV decoder
    # and the features.
    g3n = "gemma3n"
    seeds["config_gemma3n"] = {"fixture": joined(read(f"{g3n}/config.json"), read(f"{g3n}/processor_config.json")),
                               "config_only": read(f"{g3n}/config.json")}
    chirp, short = read(f"{g3n}/inputs/chirp.wav"), read(f"{g3n}/inputs/short_chirp.wav")
    seeds["preprocess_gemma3n"] = {"chirp": b"\0\0" + chirp, "short_chirp_limit_1s": (10).to_bytes(2, "little") + short,
                                   "truncated": b"\0\0" + chirp[:40]}
    for family, fixture, processor in FAMILIES:
        config, proc = read(f"{fixture}/config.json"), read(f"{fixture}/{processor}") if processor else b""
        seeds[f"config_{family}"] = {"fixture": joined(config, proc), "config_only": config}
        wide, tall = read(f"{fixture}/inputs/wide.png"), read("qwen2_vl/inputs/tall.png")
        seeds[f"preprocess_{family}"] = {
            "wide_png": preprocess_seed(0, wide),
            "tall_png": preprocess_seed(0, tall),
            "wide_png_bounded": preprocess_seed(6, wide, max_pixels=64 * 64, min_pixels=16 * 16),
            "rgb_33x17": preprocess_seed(1, rgb(33, 17, bytes(range(0, 256, 3)))),
            "rgb_1x1": preprocess_seed(1, rgb(1, 1, b"\xff\x00\x80")),
            "rgb_900x2": preprocess_seed(1, rgb(900, 2, b"\x10\x20\x30\x40")),
            "rgb_64x64_bounded": preprocess_seed(7, rgb(64, 64, b"\x7f"), max_pixels=1024, min_pixels=4096),
        }

    seeds["manifest"] = {p.stem: p.read_bytes() for p in sorted((ROOT / "manifests").glob("*.toml"))}

    seeds["decoder_config"] = {
        name: read(f"{name}/config.json")
        for name in ["llama", "qwen2", "qwen3", "gemma3_text", "gemma3_text_softcap", "gemma3", "qwen2_vl",
                     "qwen3_vl", "molmo2_olmo", "qwen3_mlx_q4", "llama_mlx_mixed", "llama_hub", "gemma3_text_hub"]
    }

    seeds["safetensors_header"] = {
        "f32": safetensors([("w", "F32", [2, 3]), ("b", "F32", [3])]),
        "bf16_pt": safetensors([("model.embed_tokens.weight", "BF16", [4, 2])], {"format": "pt"}),
        "mlx_q4": safetensors(
            [("l.weight", "U32", [4, 1]), ("l.scales", "F32", [4, 1]), ("l.biases", "F32", [4, 1])],
            {"format": "mlx"},
        ),
        "aligned": safetensors([("x", "F16", [32]), ("y", "I64", [2])], pad=48),
        "other_dtypes": safetensors([("m", "BOOL", [5]), ("q", "F8_E4M3", [3]), ("u", "U8", [0])]),
        "empty": safetensors([]),
    }

    index = lambda m: json.dumps({"metadata": {"total_size": 24}, "weight_map": m}).encode()  # noqa: E731
    seeds["safetensors_index"] = {
        "two_shards": index({"a": "a.safetensors", "b": "a.safetensors", "c": "b.safetensors"}),
        "fuzz_shard": joined(
            index({"a": "a.safetensors", "z": "fuzz.safetensors"}), safetensors([("z", "F32", [1])], {"format": "mlx"})
        ),
        "wrong_shard": index({"a": "b.safetensors"}),
        "hub_qwen2_vl": read("qwen2_vl_hub/model.safetensors.index.json"),
    }

    seeds["tokenizer"] = {
        "qwen2_vl": joined(read("qwen2_vl/tokenizer.json"), "Hello <|image_pad|> wörld 🐈\n".encode()),
        "gemma3": joined(read("gemma3/tokenizer.json"), b"<start_of_turn>user\nHi<end_of_turn>"),
        "wordlevel": joined(
            json.dumps({
                "version": "1.0", "added_tokens": [{"id": 2, "content": "<s>", "single_word": False, "lstrip": False,
                                                    "rstrip": False, "normalized": False, "special": True}],
                "normalizer": {"type": "Lowercase"}, "pre_tokenizer": {"type": "Whitespace"},
                "post_processor": None, "decoder": None,
                "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1, "<s>": 2, "[UNK]": 3}, "unk_token": "[UNK]"},
            }).encode(),
            b"A b <s> c",
        ),
        "unigram": joined(
            json.dumps({
                "version": "1.0", "added_tokens": [], "normalizer": None,
                "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                                  "split": True},
                "post_processor": None,
                "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
                "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": True,
                          "vocab": [["<unk>", 0.0], ["\u2581a", -1.0], ["b", -2.0], ["<0x41>", -3.0]]},
            }).encode(),
            b"ab A",
        ),
    }

    messages = json.dumps([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is {{ this }}?"}]},
        {"role": "assistant", "content": "A cat."},
    ]).encode()
    chat = {}
    for name in ["qwen2_vl", "gemma3", "llava", "molmo", "molmo2", "llama", "gemma3n"]:
        chat[name] = joined(read(f"{name}/chat_template.jinja"), read(f"{name}/tokenizer_config.json"), messages)
    config = json.loads(read("gemma3_hub/tokenizer_config.json"))
    config["chat_template"] = json.loads(read("gemma3_hub/chat_template.json"))["chat_template"]
    chat["tokenizer_config_only"] = joined(b"", json.dumps(config).encode())
    seeds["chat_template"] = chat

    png = "data:image/png;base64," + base64.b64encode(read("qwen2_vl/inputs/wide.png")).decode()
    wav = base64.b64encode(read("gemma3n/inputs/short_chirp.wav")).decode()
    body = lambda **fields: json.dumps({"model": "m", **fields}).encode()  # noqa: E731
    user = [{"role": "user", "content": "Hi"}]
    seeds["chat_request"] = {
        "text": body(messages=user),
        "image": body(messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": png, "detail": "low"}}, {"type": "text", "text": "What?"}]}],
            max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True}),
        "audio": body(messages=[{"role": "developer", "content": "Transcribe."}, {"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}]}]),
        "remote": body(messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}}]}]),
        "sampling": body(messages=user, top_p=0.9, top_k=40, min_p=0.05, repetition_penalty=1.1,
                         frequency_penalty=0.5, presence_penalty=-0.5, seed=7, stop=["\n", "END"],
                         stop_token_ids=[2], logprobs=True, top_logprobs=5, logit_bias={"100": -100, "7": 2.5},
                         max_completion_tokens=32, n=1, store=False, ignore_eos=True),
        "tools": body(messages=[*user, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "2"}],
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            tool_choice="auto"),
        "json_schema": body(messages=user, response_format={"type": "json_schema", "json_schema": {
            "name": "pet", "strict": True, "schema": {"type": "object", "properties": {"name": {"type": "string"}}}}}),
        "completion": body(prompt="Once upon a time", max_tokens=8, echo=False, best_of=1),
    }

    for target, files in seeds.items():
        out = SEEDS / target
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for name, data in files.items():
            (out / name).write_bytes(data)
    print(f"generate: {sum(len(f) for f in seeds.values())} seeds for {len(seeds)} targets in {SEEDS}")


if __name__ == "__main__":
    main()
