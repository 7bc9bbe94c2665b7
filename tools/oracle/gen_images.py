"""Image corpus: small files of every format and option the server decodes, each with the RGB pixels
transformers' `load_image` gives for it (Pillow opens the file, `ImageOps.exif_transpose`, `convert("RGB")`),
and the files the server refuses, with what Pillow does with them.

Writes tests/fixtures/images/: the encoded files, `<name>.rgb` (the reference's pixels, row-major RGB bytes),
`cases.json` (per case: file, format, size and pixels, or the refusal expected and Pillow's own outcome) and
`provenance.json` (versions, including the libjpeg-turbo and libwebp Pillow links). Odd sizes (37x23, 50x33)
put chroma-subsampling edges inside the image. `--check` rebuilds everything in memory and compares it with
the committed files byte for byte (Pillow's encoders and decoders are deterministic), writing nothing.
"""

from __future__ import annotations

import io
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, features
from transformers.image_utils import load_image

import check as fixture_check
from common import FIXTURES, fresh_dir, json_bytes, parse_args, synthetic_image

NAME = "images"
SCRIPT = "gen_images.py"
# The server's pixel limit (PIL's default MAX_IMAGE_PIXELS); the bomb cases declare far more.
MAX_PIXELS = 89_478_485
ORIENTATION = 0x0112


# ----------------------------------------------------------------------------------------------------------
# pictures and hand-written containers (for what Pillow's encoders do not write)


def picture(width: int, height: int, kind: int = 0) -> Image.Image:
    """Gradients and a checkerboard, plus a diagonal so a wrong transposition cannot hide."""
    im = np.array(synthetic_image(width, height, kind))
    y, x = np.mgrid[0:height, 0:width]
    im[(x + 2 * y) % 11 == 0] = (250, 10, 120)
    return Image.fromarray(im, "RGB")


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def raw_png(width: int, height: int, depth: int, color: int, rows: list[bytes], extra: bytes = b"",
            after: bytes = b"") -> bytes:
    """A PNG of already-packed rows (filter 0), with `extra` chunks before the image data and `after` it."""
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, 0)
    data = zlib.compress(b"".join(b"\0" + r for r in rows), 9)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + extra + png_chunk(b"IDAT", data) + after
            + png_chunk(b"IEND", b""))


def pack(samples: np.ndarray, depth: int) -> list[bytes]:
    """Rows of samples packed at 1, 2 or 4 bits (most significant first), 8, or 16 (big-endian)."""
    rows = []
    for row in samples:
        if depth == 16:
            rows.append(row.astype(">u2").tobytes())
        elif depth == 8:
            rows.append(row.astype(np.uint8).tobytes())
        else:
            per = 8 // depth
            padded = np.concatenate([row, np.zeros((-len(row)) % per, row.dtype)]).reshape(-1, per)
            shifts = np.arange(per)[::-1] * depth
            rows.append(((padded.astype(np.uint16) << shifts).sum(1)).astype(np.uint8).tobytes())
    return rows


def lzw_gif_data(indices: np.ndarray, min_code: int = 8) -> bytes:
    """Indices as GIF image data: a clear code before every run of 250 literals keeps every code 9 bits wide
    (no dictionary growth past the width), which any decoder reads; then the sub-blocks."""
    clear, end, width = 1 << min_code, (1 << min_code) + 1, min_code + 1
    codes: list[int] = []
    flat = indices.reshape(-1).tolist()
    for start in range(0, len(flat), 250):
        codes.append(clear)
        codes.extend(flat[start:start + 250])
    codes.append(end)
    acc = bits = 0
    out = bytearray()
    for c in codes:
        acc |= c << bits
        bits += width
        while bits >= 8:
            out.append(acc & 0xFF)
            acc >>= 8
            bits -= 8
    if bits:
        out.append(acc & 0xFF)
    blocks = b"".join(bytes([len(out[i:i + 255])]) + bytes(out[i:i + 255]) for i in range(0, len(out), 255))
    return bytes([min_code]) + blocks + b"\0"


def raw_gif(screen: tuple[int, int], frame: tuple[int, int, int, int], indices: np.ndarray,
            global_palette: bytes | None, local_palette: bytes | None = None, transparent: int | None = None,
            background: int = 0) -> bytes:
    def table_bits(p: bytes) -> int:
        return max(0, (len(p) // 3 - 1).bit_length() - 1)

    flags = 0x80 | table_bits(global_palette) if global_palette else 0
    out = b"GIF89a" + struct.pack("<HHBBB", *screen, flags, background, 0) + (global_palette or b"")
    if transparent is not None:
        out += b"!\xf9\x04" + struct.pack("<BHB", 1, 0, transparent) + b"\0"
    left, top, w, h = frame
    lflags = (0x80 | table_bits(local_palette)) if local_palette else 0
    out += b"," + struct.pack("<HHHHB", left, top, w, h, lflags) + (local_palette or b"")
    return out + lzw_gif_data(indices) + b";"


def exif_block(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    exif[0x010F] = "mlxcel"
    return exif.tobytes()


def xmp_packet(orientation: int, attribute: bool = True) -> bytes:
    tag = (f'tiff:Orientation="{orientation}"' if attribute
           else f"><tiff:Orientation>{orientation}</tiff:Orientation")
    return (b'<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?><x:xmpmeta xmlns:x="adobe:ns:meta/">'
            b'<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description '
            b'xmlns:tiff="http://ns.adobe.com/tiff/1.0/" ' + tag.encode()
            + b"/></rdf:RDF></x:xmpmeta><?xpacket end=\"w\"?>")


def saved(im: Image.Image, fmt: str, **options: Any) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **options)
    return buf.getvalue()


def with_trns(png: bytes, trns: bytes) -> bytes:
    """Inserts a tRNS chunk before the image data."""
    at = png.index(b"IDAT") - 4
    return png[:at] + png_chunk(b"tRNS", trns) + png[at:]


# ----------------------------------------------------------------------------------------------------------
# the corpus


def decoded_cases() -> dict[str, tuple[str, bytes, str]]:
    """name -> (extension, bytes, what it exercises), for files the server decodes."""
    cases: dict[str, tuple[str, bytes, str]] = {}

    def add(name: str, ext: str, data: bytes, what: str) -> None:
        cases[name] = (ext, data, what)

    small, large = picture(37, 23), picture(50, 33, 1)
    # JPEG: every subsampling at both sizes, progressive, greyscale.
    for sub, label in ((0, "444"), (1, "422"), (2, "420")):
        for im in (small, large):
            w, h = im.size
            add(f"jpeg_{label}_{w}x{h}", "jpg", saved(im, "JPEG", quality=87, subsampling=sub),
                f"baseline jpeg, {label[0]}:{label[1]}:{label[2]} chroma")
        add(f"jpeg_progressive_{label}", "jpg", saved(large, "JPEG", quality=80, subsampling=sub, progressive=True),
            f"progressive jpeg, {label[0]}:{label[1]}:{label[2]} chroma")
    grey = small.convert("L")
    add("jpeg_grey", "jpg", saved(grey, "JPEG", quality=90), "greyscale jpeg")
    add("jpeg_grey_progressive", "jpg", saved(large.convert("L"), "JPEG", quality=70, progressive=True),
        "progressive greyscale jpeg")
    add("jpeg_low_quality", "jpg", saved(large, "JPEG", quality=12, subsampling=2), "heavy quantisation, 4:2:0")
    # Complete files libjpeg-turbo warns about, which Pillow decodes through.
    whole = saved(small, "JPEG", quality=85)
    add("jpeg_extraneous_bytes", "jpg", whole[:-2] + b"\x00\x01\x02" + whole[-2:],
        "3 extraneous bytes before the end-of-image marker (a libjpeg-turbo warning)")
    mid = (whole.index(b"\xff\xda") + len(whole)) // 2
    mid += whole[mid - 1:mid + 1].count(0xFF)  # not inside a stuffed ff 00
    add("jpeg_corrupt_scan", "jpg", whole[:mid] + b"\xff\xd3" + whole[mid:],
        "a stray restart marker mid-scan (libjpeg-turbo's recovery from corrupt data, as in Pillow)")
    # EXIF orientations 2..8 (and 1) on JPEG; XMP only; a non-orientation value.
    for o in range(1, 9):
        add(f"jpeg_exif_{o}", "jpg", saved(small, "JPEG", quality=85, exif=exif_block(o)), f"exif orientation {o}")
    add("jpeg_exif_9", "jpg", saved(small, "JPEG", quality=85, exif=exif_block(9)), "exif orientation 9: ignored")
    add("jpeg_xmp_6", "jpg", saved(small, "JPEG", quality=85, xmp=xmp_packet(6)), "xmp tiff:Orientation=\"6\" only")
    add("jpeg_exif_1_xmp_8", "jpg", saved(small, "JPEG", quality=85, exif=exif_block(1), xmp=xmp_packet(8)),
        "exif orientation 1 wins over xmp 8")
    add("jpeg_grey_exif_6", "jpg", saved(grey, "JPEG", quality=85, exif=exif_block(6)), "greyscale, orientation 6")

    # PNG: every colour type and depth.
    add("png_rgb8", "png", saved(small, "PNG"), "rgb, 8 bits")
    rgba = small.copy()
    rgba.putalpha(Image.linear_gradient("L").resize(small.size))
    add("png_rgba8", "png", saved(rgba, "PNG"), "rgba, 8 bits (alpha dropped)")
    add("png_l8", "png", saved(grey, "PNG"), "grey, 8 bits")
    la = grey.copy()
    la.putalpha(128)
    add("png_la8", "png", saved(la, "PNG"), "grey and alpha, 8 bits")
    g = np.asarray(grey)
    for depth in (1, 2, 4):
        add(f"png_l{depth}", "png", raw_png(37, 23, depth, 0, pack(g >> (8 - depth), depth)), f"grey, {depth} bits")
    ramp = (np.arange(37 * 23, dtype=np.uint32).reshape(23, 37) * 97) % 65536
    add("png_l16", "png", raw_png(37, 23, 16, 0, pack(ramp, 16)), "grey, 16 bits (Pillow's I;16: clipped at 255)")
    add("png_l16_trns", "png", with_trns(raw_png(37, 23, 16, 0, pack(ramp, 16)), struct.pack(">H", 97)),
        "grey, 16 bits, with tRNS")
    rgb16 = np.asarray(small).astype(np.uint32) * 257 + np.arange(3)
    add("png_rgb16", "png", raw_png(37, 23, 16, 2, pack(rgb16.reshape(23, -1), 16)), "rgb, 16 bits (high byte)")
    rgba16 = np.concatenate([rgb16, np.full((23, 37, 1), 30000)], -1)
    add("png_rgba16", "png", raw_png(37, 23, 16, 6, pack(rgba16.reshape(23, -1), 16)), "rgba, 16 bits")
    la16 = np.stack([ramp, 65535 - ramp], -1)
    add("png_la16", "png", raw_png(37, 23, 16, 4, pack(la16.reshape(23, -1), 16)), "grey and alpha, 16 bits")
    add("png_l8_trns", "png", with_trns(saved(grey, "PNG"), struct.pack(">H", 128)), "grey with tRNS")
    add("png_rgb8_trns", "png", with_trns(saved(small, "PNG"), struct.pack(">HHH", 250, 10, 120)), "rgb with tRNS")
    pal = small.quantize(colors=200, dither=Image.Dither.NONE)
    add("png_palette", "png", saved(pal, "PNG"), "palette, 8 bits")
    add("png_palette_trns", "png", with_trns(saved(pal, "PNG"), bytes(range(0, 250, 5))), "palette with tRNS")
    pal16 = small.quantize(colors=16, dither=Image.Dither.NONE)
    add("png_palette_4bit", "png", saved(pal16, "PNG", bits=4), "palette, 4 bits")
    short_plte = png_chunk(b"PLTE", bytes([200, 30, 40, 10, 220, 90]))
    idx = (np.arange(37 * 23).reshape(23, 37) % 4).astype(np.uint8)
    add("png_palette_short", "png", raw_png(37, 23, 2, 3, pack(idx, 2), short_plte),
        "2-bit palette of 2 entries, indices 2 and 3 past it (black)")
    # Orientation on PNG: eXIf chunk, eXIf after the image data, the raw-profile text, XMP.
    add("png_exif_6", "png", saved(small, "PNG", exif=exif_block(6)), "exif orientation 6 (eXIf chunk)")
    exif = exif_block(3)[6:]
    add("png_exif_after_idat_3", "png", raw_png(37, 23, 8, 2, pack(np.asarray(small).reshape(23, -1), 8),
                                                after=png_chunk(b"eXIf", exif)), "eXIf chunk after IDAT, orientation 3")
    raw = exif_block(5)[6:]
    profile = f"\nexif\n{len(raw):8}\n{raw.hex()}\n".encode()
    add("png_raw_profile_5", "png", raw_png(37, 23, 8, 2, pack(np.asarray(small).reshape(23, -1), 8),
                                            png_chunk(b"zTXt", b"Raw profile type exif\0\0" + zlib.compress(profile))),
        "raw exif profile in a zTXt chunk, orientation 5")
    xmp_itxt = png_chunk(b"iTXt", b"XML:com.adobe.xmp\0\0\0\0\0" + xmp_packet(8, attribute=False))
    add("png_xmp_8", "png", raw_png(37, 23, 8, 2, pack(np.asarray(small).reshape(23, -1), 8), xmp_itxt),
        "xmp <tiff:Orientation>8</tiff:Orientation> in an iTXt chunk")

    # WebP: lossy and lossless, with and without alpha; orientation.
    for im in (small, large):
        w, h = im.size
        add(f"webp_lossy_{w}x{h}", "webp", saved(im, "WEBP", quality=80), "lossy webp")
    rgba_large = large.copy()
    rgba_large.putalpha(Image.linear_gradient("L").resize(large.size))
    add("webp_lossy_alpha", "webp", saved(rgba_large, "WEBP", quality=70), "lossy webp with alpha")
    add("webp_lossless", "webp", saved(small, "WEBP", lossless=True), "lossless webp")
    add("webp_lossless_alpha", "webp", saved(rgba, "WEBP", lossless=True, exact=True), "lossless webp with alpha")
    add("webp_exif_6", "webp", saved(small, "WEBP", quality=80, exif=exif_block(6)), "lossy webp, exif orientation 6")
    add("webp_xmp_3", "webp", saved(small, "WEBP", quality=80, xmp=xmp_packet(3)), "lossy webp, xmp orientation 3")

    # GIF: first frame; canvas and palette rules.
    add("gif_palette", "gif", saved(pal, "GIF"), "gif, global palette (interlaced: Pillow interlaces by default)")
    add("gif_transparent", "gif", saved(pal, "GIF", transparency=3), "gif with a transparent index")
    add("gif_grey", "gif", saved(grey, "GIF"), "gif of a grey image (identity ramp palette: Pillow's mode L)")
    frames = [pal, small.rotate(180).quantize(colors=64, dither=Image.Dither.NONE)]
    add("gif_animated", "gif", saved(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0),
        "animated gif: the first frame")
    sub = (np.arange(20 * 11).reshape(11, 20) % 7).astype(np.uint8)
    palette7 = bytes([10, 20, 30, 200, 0, 0, 0, 200, 0, 0, 0, 200, 90, 90, 90, 250, 250, 0, 0, 250, 250, 1, 2, 3])
    add("gif_offset_frame", "gif", raw_gif((37, 23), (9, 5, 20, 11), sub, palette7),
        "first frame smaller than the screen at (9, 5): the rest index 0")
    add("gif_offset_frame_transparent", "gif", raw_gif((37, 23), (9, 5, 20, 11), sub, palette7, transparent=5),
        "the same with transparent index 5: the rest index 5")
    add("gif_frame_past_screen", "gif", raw_gif((30, 20), (9, 5, 30, 17), (np.arange(30 * 17).reshape(17, 30) % 8)
                                                .astype(np.uint8), palette7),
        "first frame past the screen: the canvas grows to 39x22")
    add("gif_local_palette", "gif", raw_gif((20, 11), (0, 0, 20, 11), sub, palette7, local_palette=palette7[::-1] + b"\0" * 24),
        "local palette over the global one")
    add("gif_no_palette", "gif", raw_gif((20, 11), (0, 0, 20, 11), sub * 30, None), "no palette: indices are grey levels")
    add("gif_short_palette", "gif", raw_gif((20, 11), (0, 0, 20, 11), sub, palette7[:12]),
        "indices 4 to 6 past a 4-entry palette: black")
    return cases


def refused_cases() -> dict[str, tuple[str, bytes, str, str]]:
    """name -> (extension, bytes, the server's refusal, what it is)."""
    small = picture(37, 23)
    cases: dict[str, tuple[str, bytes, str, str]] = {}

    def add(name: str, ext: str, data: bytes, refusal: str, what: str) -> None:
        cases[name] = (ext, data, refusal, what)

    cmyk = saved(small.convert("CMYK"), "JPEG", quality=85)
    add("refused_jpeg_cmyk", "jpg", cmyk, "unsupported", "cmyk jpeg")
    jpeg = saved(small, "JPEG", quality=85)
    add("refused_jpeg_truncated", "jpg", jpeg[: len(jpeg) // 2], "corrupt", "jpeg cut in half")
    png = saved(small, "PNG")
    add("refused_png_truncated", "png", png[: len(png) // 2], "corrupt", "png cut in half")
    add("refused_apng", "png", saved(small, "PNG", save_all=True, append_images=[small.rotate(180)]), "unsupported",
        "animated png (two frames)")
    webp = saved(small, "WEBP", quality=80)
    add("refused_webp_truncated", "webp", webp[: len(webp) // 2], "corrupt", "webp cut in half")
    add("refused_webp_animated", "webp", saved(small, "WEBP", save_all=True, append_images=[small.rotate(180)],
                                               duration=100, lossless=True), "unsupported", "animated webp")
    gif = saved(small.quantize(colors=32), "GIF")
    add("refused_gif_truncated", "gif", gif[: len(gif) // 2], "corrupt", "gif cut in half")
    add("refused_bmp", "bmp", saved(small, "BMP"), "unrecognized", "bmp: a format not served")
    add("refused_text", "txt", b"this is not an image\n", "unrecognized", "not an image")
    # Bombs: a header declaring 50,000 x 50,000 pixels, and little else.
    add("refused_png_bomb", "png", raw_png(50_000, 50_000, 8, 0, [b""])[:60] + b"\0" * 64, "too_many_pixels",
        "png header declaring 50000x50000")
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, 50_000, 50_000, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    add("refused_jpeg_bomb", "jpg", b"\xff\xd8" + sof + b"\xff\xda" + b"\0" * 64, "too_many_pixels",
        "jpeg frame header declaring 50000x50000")
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\0\0\0\0" + (49_999).to_bytes(3, "little") * 2
    add("refused_webp_bomb", "webp", b"RIFF" + struct.pack("<I", 4 + len(vp8x)) + b"WEBP" + vp8x, "too_many_pixels",
        "webp vp8x canvas of 50000x50000")
    add("refused_gif_bomb", "gif", b"GIF89a" + struct.pack("<HHBBB", 50_000, 50_000, 0, 0, 0)
        + b"," + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x08\x02\x00\x01\x00;", "too_many_pixels",
        "gif screen of 50000x50000")
    return cases


def pillow_outcome(path: Path) -> str:
    try:
        load_image(str(path))
        return "loads"
    except Exception as e:  # noqa: BLE001  (what Pillow raises is the record)
        return type(e).__name__


def build(out: Path) -> dict[str, bytes]:
    """Every file of the fixture but provenance.json, by name (the encoded files are written to `out` first,
    since `load_image` reads a path)."""
    files: dict[str, bytes] = {}
    table: dict[str, Any] = {}
    for name, (ext, data, what) in decoded_cases().items():
        file = f"{name}.{ext}"
        (out / file).write_bytes(data)
        rgb = load_image(str(out / file))
        assert rgb.mode == "RGB"
        files[file] = data
        files[f"{name}.rgb"] = np.asarray(rgb).tobytes()
        table[name] = {"file": file, "what": what, "width": rgb.width, "height": rgb.height, "rgb": f"{name}.rgb"}
    for name, (ext, data, refusal, what) in refused_cases().items():
        file = f"{name}.{ext}"
        (out / file).write_bytes(data)
        files[file] = data
        table[name] = {"file": file, "what": what, "refused": refusal, "pillow": pillow_outcome(out / file)}
    files["cases.json"] = json_bytes({"max_pixels": MAX_PIXELS, "cases": table})
    return files


def provenance() -> dict[str, Any]:
    import importlib.metadata as md

    return {
        "cpu": fixture_check.cpu(),
        "reference": "transformers.image_utils.load_image (Pillow: open, ImageOps.exif_transpose, convert('RGB'))",
        "versions": {
            "python": sys.version.split()[0],
            **{n: md.version(n) for n in ("transformers", "pillow", "numpy")},
            "pillow libjpeg-turbo": features.version("libjpeg_turbo"),
            "pillow libwebp": features.version("webp"),
            "pillow zlib": features.version("zlib"),
        },
        "generator": f"tools/oracle/{SCRIPT}",
        "command": f"tools/oracle/regen.sh {NAME}  (or: $ORACLE_VENV/bin/python tools/oracle/{SCRIPT})",
        "notes": [
            "<name>.rgb: the RGB bytes load_image returns, row-major, width and height in cases.json",
            "refused cases: the refusal the server gives; 'pillow' says what load_image does with the file "
            "(it loads CMYK JPEG, the first frame of animations and APNG, which the server refuses)",
        ],
    }


def main() -> None:
    args = parse_args(__doc__)
    fixture = FIXTURES / NAME
    scratch = Path("/tmp") / "mlxcel-oracle-images"
    fresh_dir(scratch)
    files = build(scratch)
    size = sum(len(d) for d in files.values())
    if args.check:
        check = fixture_check.FixtureCheck(fixture, bf16=False)
        for name, data in sorted(files.items()):
            check.exact(fixture / name, data)
        made_on = check.provenance(fixture / "provenance.json", json_bytes(provenance()))
        check.finish(made_on)
    else:
        fresh_dir(fixture)
        for name, data in files.items():
            (fixture / name).write_bytes(data)
        (fixture / "provenance.json").write_bytes(json_bytes(provenance()))
    decoded = sum(1 for n in files if n.endswith(".rgb"))
    print(f"  {NAME}: {decoded} decoded cases, {len(refused_cases())} refused, {size / 1e3:.0f} kB", flush=True)
    if size > 1_000_000:
        raise RuntimeError(f"the image corpus is {size} bytes, over its 1 MB budget")


if __name__ == "__main__":
    main()
