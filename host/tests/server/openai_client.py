"""Drives a running `mlxcel-host serve` with the official `openai` Python client.

Run by host/tests/it/server.rs, which starts the server on the Qwen2-VL fixture and checks the
JSON this prints against the fixture's goldens. Each scenario asserts what the protocol
promises and prints its observations as one JSON object on stdout.

    python openai_client.py SCENARIO --base-url http://127.0.0.1:PORT/v1 --fixture DIR
"""

import argparse
import base64
import concurrent.futures
import json
import struct
import sys
import time
import zlib
from pathlib import Path

import urllib.error
import urllib.request
import openai

GREEDY = {"temperature": 0, "max_tokens": 16}
IGNORE_EOS = {"ignore_eos": True}


MIME = {".png": "image/png", ".jpg": "image/jpeg", ".webp": "image/webp", ".gif": "image/gif"}
# Golden variants whose image is a file as clients send it (tools/oracle/common.py client_formats).
CLIENT_FORMAT_VARIANTS = ["image_jpeg", "image_webp", "image_jpeg_exif"]


def data_url(path):
    path = Path(path)
    return f"data:{MIME[path.suffix]};base64," + base64.b64encode(path.read_bytes()).decode()


def audio_part(path):
    """An input_audio part: the WAV file's bytes, base64, as OpenAI clients send a clip."""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


def golden_messages(fixture, golden):
    """The golden's messages in the wire format, its images and audio clips inline in order."""
    images = iter(golden.get("images", []))
    clips = iter(golden.get("audio", []))
    messages = []
    for m in golden["messages"]:
        parts = []
        for part in m["content"]:
            if part["type"] == "image":
                parts.append({"type": "image_url", "image_url": {"url": data_url(fixture / next(images))}})
            elif part["type"] == "audio":
                parts.append(audio_part(fixture / next(clips)))
            else:
                parts.append({"type": "text", "text": part["text"]})
        messages.append({"role": m["role"], "content": parts})
    return messages


def scenario_golden(client, args):
    """Each golden variant greedy, whole and streamed, with logprobs naming every token."""
    out = {}
    model = args.model
    for variant in ["text_only", "image", "two_images"]:
        golden = json.loads((args.fixture / "goldens" / f"{variant}.json").read_text())
        messages = golden_messages(args.fixture, golden)
        whole = client.chat.completions.create(
            model=model, messages=messages, logprobs=True, top_logprobs=2, extra_body=IGNORE_EOS, **GREEDY
        )
        choice = whole.choices[0]
        assert choice.finish_reason == "length", choice.finish_reason
        assert whole.usage.completion_tokens == 16, whole.usage
        assert whole.usage.prompt_tokens == golden["n_prompt_tokens"], (whole.usage, golden["n_prompt_tokens"])
        for entry in choice.logprobs.content:
            assert len(entry.top_logprobs) == 2, entry
            assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob, entry
            # Greedy: the chosen token is the most likely one.
            assert abs(entry.logprob - entry.top_logprobs[0].logprob) < 1e-6, entry

        stream = client.chat.completions.create(
            model=model,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=IGNORE_EOS,
            **GREEDY,
        )
        pieces, finish, usage, roles = [], None, None, 0
        for chunk in stream:
            if chunk.usage is not None:
                assert chunk.choices == [], chunk
                usage = chunk.usage
                continue
            delta = chunk.choices[0].delta
            roles += delta.role == "assistant"
            if delta.content:
                pieces.append(delta.content)
            if chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        assert roles == 1, roles
        assert finish == "length", finish
        assert usage is not None and usage.completion_tokens == 16, usage
        assert "".join(pieces) == choice.message.content, ("".join(pieces), choice.message.content)
        # A stop string cut out of the greedy text: both modes end just before it.
        text = choice.message.content
        stop = text[4:6]
        expected = text[: text.find(stop)]
        cut = client.chat.completions.create(model=model, messages=messages, stop=[stop], extra_body=IGNORE_EOS, **GREEDY)
        assert cut.choices[0].finish_reason == "stop", cut
        assert cut.choices[0].message.content == expected, (cut.choices[0].message.content, expected, stop)
        streamed = client.chat.completions.create(
            model=model, messages=messages, stop=stop, stream=True, extra_body=IGNORE_EOS, **GREEDY
        )
        pieces, finish = [], None
        for chunk in streamed:
            if chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            finish = chunk.choices[0].finish_reason or finish
        assert finish == "stop" and "".join(pieces) == expected, ("".join(pieces), expected, finish)
        out[variant] = {
            "text": choice.message.content,
            "tokens": [e.token for e in choice.logprobs.content],
            "prompt_tokens": whole.usage.prompt_tokens,
        }
    return out


def scenario_models(client, args):
    models = client.models.list()
    return {"data": [m.model_dump() for m in models.data]}


def golden_params(golden):
    """A golden request's parameters: greedy, as many tokens as the golden holds (16, or fewer when its reference
    cut them before a tie)."""
    return {"logprobs": True, "extra_body": IGNORE_EOS, **GREEDY, "max_tokens": len(golden["greedy_tokens"])}


def mixed_requests(args):
    """Eight requests: text and image, greedy and seeded sampling, two of them golden variants (image, or
    image_jpeg where the fixture has no image, and two_images or, for a family of one image per prompt, long);
    then the golden
    variants sent as JPEG, WebP and EXIF-rotated JPEG, where the fixture has them."""
    # An audio family's fixture (Gemma 3n) has WAV clips where the others have images.
    clips = sorted((args.fixture / "inputs").glob("*.wav"))
    images = sorted((args.fixture / "inputs").glob("*.png"))
    media = [audio_part(c) for c in clips] if clips else [
        {"type": "image_url", "image_url": {"url": data_url(args.fixture / "inputs" / "wide.png")}},
        {"type": "image_url", "image_url": {"url": data_url(images[-1])}},
    ]
    requests = []
    for i in range(8):
        if i in (3, 6):
            # A family taking one image per prompt (Molmo) sends its long image variant instead of
            # two_images; a fixture without the PNG image variant (molmo_mlx_q4) its JPEG one; an
            # audio family its audio and two_audios variants.
            has = lambda v: (args.fixture / "goldens" / f"{v}.json").exists()
            first = next(v for v in ("image", "image_jpeg", "audio") if has(v))
            variant = first if i == 3 else next(v for v in ("two_images", "two_audios", "long") if has(v))
            golden = json.loads((args.fixture / "goldens" / f"{variant}.json").read_text())
            params = golden_params(golden)
            requests.append((variant, golden_messages(args.fixture, golden), params))
            continue
        if i % 2 == 0:
            content = f"Count to {i + 3}, please."
        else:
            item = media[0] if i % 4 == 1 else media[-1]
            content = [item, {"type": "text", "text": f"Describe it ({i})."}]
        params = {"max_tokens": 12 + i, "extra_body": IGNORE_EOS}
        if i in (2, 5):
            params.update(temperature=0.8, top_p=0.9, seed=1000 + i)
        else:
            params.update(temperature=0)
        requests.append((None, [{"role": "user", "content": content}], params))
    # The fixture's images sent as JPEG, WebP and EXIF-rotated JPEG, when it has them, join the batch.
    for variant in CLIENT_FORMAT_VARIANTS:
        path = args.fixture / "goldens" / f"{variant}.json"
        if path.exists():
            golden = json.loads(path.read_text())
            requests.append((variant, golden_messages(args.fixture, golden), golden_params(golden)))
    return requests


def scenario_concurrent(client, args):
    """Each of 8 mixed requests alone, then all 8 at once: the same text for each; the golden
    variants' tokens are returned for the caller to check."""
    requests = mixed_requests(args)

    def run(request):
        _, messages, params = request
        r = client.chat.completions.create(model=args.model, messages=messages, **params)
        tokens = [e.token for e in r.choices[0].logprobs.content] if r.choices[0].logprobs else None
        return r.choices[0].message.content, r.usage.completion_tokens, tokens

    alone = [run(r) for r in requests]
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(run, requests))
    for i, (a, t) in enumerate(zip(alone, together)):
        assert a == t, f"request {i}: alone {a!r}, batched {t!r}"
    goldens = {variant: together[i][2] for i, (variant, _, _) in enumerate(requests) if variant}
    return {"alone": alone, "together": together, "goldens_batched": goldens}


def scenario_text_goldens(client, args):
    """Every golden variant of a text checkpoint, greedy: alone, then all at once (and twice
    over, so more requests than one run alone share the batch); each gives the same tokens
    both ways, and those are returned for the caller to check against the goldens."""
    variants = sorted(p.stem for p in (args.fixture / "goldens").glob("*.json"))

    def run(variant):
        golden = json.loads((args.fixture / "goldens" / f"{variant}.json").read_text())
        r = client.chat.completions.create(
            model=args.model, messages=golden["messages"], logprobs=True, extra_body=IGNORE_EOS, **GREEDY
        )
        assert r.usage.prompt_tokens == golden["n_prompt_tokens"], (r.usage, golden["n_prompt_tokens"])
        return [e.token for e in r.choices[0].logprobs.content]

    alone = {v: run(v) for v in variants}
    with concurrent.futures.ThreadPoolExecutor(max_workers=2 * len(variants)) as pool:
        together = list(pool.map(run, variants * 2))
    for i, tokens in enumerate(together):
        variant = variants[i % len(variants)]
        assert tokens == alone[variant], f"{variant}: alone {alone[variant]!r}, batched {tokens!r}"
    return alone


def scenario_client_fields(client, args):
    """logit_bias bans and forces tokens, whole and streamed; fields that change nothing (store, metadata,
    service_tier, parallel_tool_calls) leave the tokens as they are; bad biases are 400s naming logit_bias."""
    golden = json.loads((args.fixture / "goldens" / "text_only.json").read_text())
    messages, greedy = golden["messages"], golden["greedy_tokens"]

    def tokens(stream=False, **params):
        kwargs = dict(model=args.model, messages=messages, logprobs=True, extra_body=IGNORE_EOS, temperature=0, max_tokens=6)
        kwargs.update(params)
        if not stream:
            return [e.token for e in client.chat.completions.create(**kwargs).choices[0].logprobs.content]
        out = []
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
                out.extend(e.token for e in chunk.choices[0].logprobs.content)
        return out

    base = tokens()
    seen = {"base": base}
    for stream in (False, True):
        banned = tokens(stream, logit_bias={str(greedy[0]): -100})
        assert banned[0] != base[0], (banned, base)
        forced = tokens(stream, logit_bias={str(greedy[3]): 100})
        assert forced == [base[3]] * len(forced), (forced, base)
        # Sampling at temperature 1.5 cannot escape a +100 bias either.
        hot = tokens(stream, logit_bias={str(greedy[3]): 100}, temperature=1.5, seed=7)
        assert hot == forced, (hot, forced)
        seen["stream" if stream else "whole"] = {"banned": banned, "forced": forced}
    harmless = tokens(store=True, metadata={"team": "a"}, service_tier="auto", parallel_tool_calls=False)
    assert harmless == base, (harmless, base)
    # Image detail: auto and high are the family's own resolution (the same tokens as none); so is low here,
    # since the in-tree budget (262144 pixels) is above this fixture's processor bound (12544). Another value
    # is a 400 naming the field (scenario_detail checks a budget that bites).
    wide = data_url(args.fixture / "inputs" / "wide.png")

    def with_image(detail):
        url = {"url": wide} if detail is None else {"url": wide, "detail": detail}
        content = [{"type": "image_url", "image_url": url}, {"type": "text", "text": "Describe it."}]
        kwargs = dict(model=args.model, messages=[{"role": "user", "content": content}], logprobs=True, temperature=0, max_tokens=6)
        return lambda: [e.token for e in client.chat.completions.create(**kwargs).choices[0].logprobs.content]

    plain = with_image(None)()
    for detail in ("auto", "high", "low"):
        assert with_image(detail)() == plain, detail
    # logit_bias on an image request (the image golden), whole and streamed: its first greedy token banned.
    image_golden = json.loads((args.fixture / "goldens" / "image.json").read_text())
    image_messages = golden_messages(args.fixture, image_golden)
    ban = {str(image_golden["greedy_tokens"][0]): -100}
    image_base = tokens(messages=image_messages)
    for stream in (False, True):
        banned = tokens(stream, messages=image_messages, logit_bias=ban)
        assert banned[0] != image_base[0], (banned, image_base)
    seen["image_bias"] = {"base": image_base, "banned": banned}
    # The fields that change nothing, on the image request and streamed too.
    harmless_image = tokens(True, messages=image_messages, store=True, metadata={"team": "a"}, service_tier="auto",
                            parallel_tool_calls=False, user="someone")
    assert harmless_image == image_base, (harmless_image, image_base)
    seen["detail_unknown"] = expect_error(400, "invalid_value", with_image("medium"))
    hi = [{"role": "user", "content": "hi"}]
    bad = lambda bias: lambda: client.chat.completions.create(model=args.model, messages=hi, max_tokens=2, logit_bias=bias)
    seen["bias_out_of_range"] = expect_error(400, "invalid_value", bad({"5": 101}))
    seen["bias_unknown_token"] = expect_error(400, "invalid_value", bad({"99999999": 1}))
    seen["bias_not_an_id"] = expect_error(400, "invalid_value", bad({"hello": 1}))
    return seen


def scenario_detail(client, args):
    """Issue 29: the golden image request with each image_url.detail, greedy: none, auto and high give one
    answer; low, sent twice, gives one answer both times (the second from the encoder and prefix caches).
    Returns each one's tokens, prompt tokens, cached prompt tokens and encoder-cache misses, for the caller to
    check against the family's budget; an unknown detail is a 400 naming the field."""
    golden = json.loads((args.fixture / "goldens" / "image.json").read_text())
    misses = "mlxcel_encoder_cache_misses_total"

    def messages(detail):
        out = golden_messages(args.fixture, golden)
        for m in out:
            for part in m["content"]:
                if part["type"] == "image_url" and detail is not None:
                    part["image_url"]["detail"] = detail
        return out

    def run(detail):
        before = metric(args.base_url, misses)
        r = client.chat.completions.create(
            model=args.model, messages=messages(detail), logprobs=True, extra_body=IGNORE_EOS, **GREEDY
        )
        details = r.usage.prompt_tokens_details
        return {
            "tokens": [e.token for e in r.choices[0].logprobs.content],
            "prompt_tokens": r.usage.prompt_tokens,
            "cached_tokens": details.cached_tokens if details else None,
            "encoder_misses": metric(args.base_url, misses) - before,
        }

    seen = {"none": run(None), "auto": run("auto"), "high": run("high"), "low": run("low"), "low_again": run("low")}
    for detail in ("auto", "high"):
        assert seen[detail]["tokens"] == seen["none"]["tokens"], (detail, seen)
        assert seen[detail]["prompt_tokens"] == seen["none"]["prompt_tokens"], (detail, seen)
    for key in ("tokens", "prompt_tokens"):
        assert seen["low_again"][key] == seen["low"][key], ("low is deterministic", key, seen)
    assert seen["low_again"]["encoder_misses"] == 0, seen
    assert seen["low_again"]["cached_tokens"] == seen["low"]["prompt_tokens"] - 1, seen
    # Streamed, low gives the same tokens.
    streamed = []
    for chunk in client.chat.completions.create(model=args.model, messages=messages("low"), logprobs=True,
                                                extra_body=IGNORE_EOS, stream=True, **GREEDY):
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            streamed.extend(e.token for e in chunk.choices[0].logprobs.content)
    assert streamed == seen["low"]["tokens"], (streamed, seen["low"])
    medium = lambda: client.chat.completions.create(model=args.model, messages=messages("medium"), max_tokens=2)
    seen["unknown"] = expect_error(400, "invalid_value", medium)
    return seen


def scenario_conversation(client, args):
    """A two-turn conversation about one image, each turn sent twice, as a chat client resends the
    whole history: what each turn answers, the prompt rows it reports cached, and the encoder
    cache's counters around it. The test compares a server with both caches against one without."""
    golden = json.loads((args.fixture / "goldens" / "image.json").read_text())
    messages = golden_messages(args.fixture, golden)
    hits, misses = "mlxcel_encoder_cache_hits_total", "mlxcel_encoder_cache_misses_total"

    def turn(history):
        before = (metric(args.base_url, hits), metric(args.base_url, misses))
        r = client.chat.completions.create(
            model=args.model, messages=history, logprobs=True, extra_body=IGNORE_EOS, **GREEDY
        )
        after = (metric(args.base_url, hits), metric(args.base_url, misses))
        details = r.usage.prompt_tokens_details
        return {
            "tokens": [e.token for e in r.choices[0].logprobs.content],
            "text": r.choices[0].message.content,
            "prompt_tokens": r.usage.prompt_tokens,
            "cached_tokens": details.cached_tokens if details else None,
            "encoder_hits": after[0] - before[0],
            "encoder_misses": after[1] - before[1],
        }

    first = turn(messages)
    again = turn(messages)
    assert again["tokens"] == first["tokens"], (again, first)
    second_history = messages + [
        {"role": "assistant", "content": first["text"]},
        {"role": "user", "content": [{"type": "text", "text": "And what colours does it have?"}]},
    ]
    second = turn(second_history)
    second_again = turn(second_history)
    assert second_again["tokens"] == second["tokens"], (second_again, second)
    # The same words about another image: only the rows before the image are kept.
    other = json.loads(json.dumps(messages))
    for part in other[-1]["content"]:
        if part["type"] == "image_url":
            part["image_url"]["url"] = data_url(args.fixture / "inputs" / "tall.png")
    other_image = turn(other)
    return {
        "other_image": other_image,
        "first": first,
        "first_again": again,
        "second": second,
        "second_again": second_again,
        "prefix_rows_reused": metric(args.base_url, "mlxcel_prefix_cache_reused_rows_total"),
    }


def metric(base, name):
    with urllib.request.urlopen(base.removesuffix("/v1") + "/metrics") as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def scenario_cancel(client, args):
    """A stream closed after a few chunks is cancelled and frees its slot; the server serves the
    next request. The fixture model is fast: a stream may finish before the client closes it
    (seen on a loaded machine), so up to five streams are tried; one must be cancelled."""
    cancelled_metric = 'mlxcel_requests_total{outcome="cancelled"}'
    finished_metric = 'mlxcel_requests_total{outcome="length"}'
    for attempt in range(5):
        before = metric(args.base_url, cancelled_metric)
        finished_before = metric(args.base_url, finished_metric)
        stream = client.chat.completions.create(
            model=args.model,
            messages=[{"role": "user", "content": "Tell a long story."}],
            stream=True,
            max_tokens=200,
            temperature=0,
            extra_body=IGNORE_EOS,
        )
        seen = 0
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                seen += 1
            if seen == 3:
                break
        stream.close()
        deadline = time.time() + 30
        outcome = None
        while time.time() < deadline and outcome is None:
            if metric(args.base_url, cancelled_metric) > before and metric(args.base_url, "mlxcel_active_slots") == 0:
                outcome = "cancelled"
            elif metric(args.base_url, finished_metric) > finished_before:
                outcome = "finished first"
            else:
                time.sleep(0.05)
        if outcome == "cancelled":
            break
    else:
        raise AssertionError(f"no closed stream was cancelled in 5 tries (last: {outcome})")
    after = client.chat.completions.create(model=args.model, messages=[{"role": "user", "content": "Say hello."}], **GREEDY)
    assert after.choices[0].message.content is not None
    return {"chunks_read": seen, "attempts": attempt + 1}


def huge_png(width, height):
    """A PNG whose header declares width x height, followed by a tiny (wrong) IDAT."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def expect_error(status, code, call):
    try:
        call()
    except openai.APIStatusError as e:
        assert e.status_code == status, (e.status_code, status, e.body)
        assert isinstance(e.body, dict) and e.body.get("code") == code, (code, e.body)
        assert e.body.get("message"), e.body
        return e.body["message"]
    raise AssertionError(f"expected HTTP {status} {code}, the request succeeded")


def scenario_errors(client, args):
    """Each bad request gets its 4xx with an OpenAI error body; the server keeps serving."""
    model = args.model
    wide = data_url(args.fixture / "inputs" / "wide.png")

    def chat(messages, **params):
        return lambda: client.chat.completions.create(model=model, messages=messages, **params)

    def image_message(*urls, text="What is this?"):
        parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
        return [{"role": "user", "content": parts + [{"type": "text", "text": text}]}]

    seen = {}
    request = urllib.request.Request(
        args.base_url + "/chat/completions",
        data=b'{"model": "x", "messages": [',
        headers={"content-type": "application/json"},
    )
    try:
        urllib.request.urlopen(request)
        raise AssertionError("malformed json was accepted")
    except urllib.error.HTTPError as e:
        assert e.code == 400, e.code
        body = json.loads(e.read())
    assert body["error"]["code"] == "invalid_json", body
    seen["malformed_json"] = body["error"]["message"]
    seen["unknown_model"] = expect_error(
        404, "model_not_found", lambda: client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    )
    bomb = "data:image/png;base64," + base64.b64encode(huge_png(30000, 30000)).decode()
    seen["oversized_image"] = expect_error(400, "invalid_image", chat(image_message(bomb), max_tokens=4))
    seen["too_many_images"] = expect_error(400, "too_many_images", chat(image_message(*[wide] * 9), max_tokens=4))
    seen["invalid_base64"] = expect_error(
        400, "invalid_base64", chat(image_message("data:image/png;base64,@@not base64@@"), max_tokens=4)
    )
    seen["corrupt_image"] = expect_error(
        400, "invalid_image", chat(image_message("data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\nxx").decode()), max_tokens=4)
    )
    seen["remote_url"] = expect_error(400, "image_url_not_allowed", chat(image_message("https://example.com/a.png"), max_tokens=4))
    # Audio to a family without the audio capability: refused by the capability gate, naming it;
    # a format the server does not decode is refused before that.
    audio = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]
    seen["unsupported_capability"] = expect_error(400, "capability_unsupported", chat(audio, max_tokens=4))
    mp3 = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "mp3"}}]}]
    seen["unsupported_audio_format"] = expect_error(400, "unsupported_audio_format", chat(mp3, max_tokens=4))
    seen["over_capacity"] = expect_error(
        400, "context_length_exceeded", chat([{"role": "user", "content": "hi"}], max_tokens=100000)
    )
    seen["unknown_field"] = expect_error(
        400, "invalid_json", chat([{"role": "user", "content": "hi"}], max_tokens=4, extra_body={"tools_x": 1})
    )
    huge = "data:image/png;base64," + "A" * 3_000_000
    seen["body_too_large"] = expect_error(413, "body_too_large", chat(image_message(huge), max_tokens=4))
    seen["bad_temperature"] = expect_error(400, "invalid_value", chat([{"role": "user", "content": "hi"}], temperature=-1))
    ok = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}], **GREEDY)
    assert ok.usage.completion_tokens >= 1
    return seen


def scenario_strict(client, args):
    """Without --allow-unqualified an experimental capability is refused; a full queue is 429."""
    wide = data_url(args.fixture / "inputs" / "wide.png")
    message = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": wide}}, {"type": "text", "text": "Hi"}]}]
    seen = {
        "unqualified": expect_error(
            400, "capability_not_qualified", lambda: client.chat.completions.create(model=args.model, messages=message, max_tokens=4)
        )
    }
    # One slot and a queue of one: of eight long requests at once, some are told to come back.
    quick = client.with_options(max_retries=0)

    def run(i):
        try:
            r = quick.chat.completions.create(
                model=args.model,
                messages=[{"role": "user", "content": f"Story {i}."}],
                max_tokens=150,
                temperature=0,
                extra_body=IGNORE_EOS,
            )
            return ("ok", r.usage.completion_tokens)
        except openai.RateLimitError as e:
            assert e.response.headers.get("retry-after") == "1", e.response.headers
            assert e.body.get("code") == "queue_full", e.body
            return ("429", None)

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(run, range(8)))
    kinds = [k for k, _ in results]
    assert "429" in kinds and "ok" in kinds, kinds
    assert all(n == 150 for k, n in results if k == "ok"), results
    seen["queue"] = kinds
    return seen


def scenario_drain(client, args):
    """SIGTERM while a stream runs: the stream still finishes; new requests are turned away."""
    import os
    import signal

    stream = client.chat.completions.create(
        model=args.model,
        messages=[{"role": "user", "content": "Tell a long story."}],
        stream=True,
        max_tokens=200,
        temperature=0,
        stream_options={"include_usage": True},
        extra_body=IGNORE_EOS,
    )
    signalled, finish, usage = False, None, None
    for chunk in stream:
        if not signalled:
            os.kill(args.server_pid, signal.SIGTERM)
            signalled = True
            # The signal is handled asynchronously: poll until new requests are turned away.
            deadline = time.time() + 20
            refused = "served"
            while refused == "served" and time.time() < deadline:
                try:
                    client.chat.completions.create(
                        model=args.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
                    )
                    time.sleep(0.05)
                except openai.APIConnectionError:
                    refused = "connection refused"
                except openai.APIStatusError as e:
                    assert e.status_code == 503, e
                    refused = "503"
        if chunk.usage is not None:
            usage = chunk.usage
        elif chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert finish == "length" and usage.completion_tokens == 200, (finish, usage)
    assert refused != "served", refused
    return {"finish": finish, "completion_tokens": usage.completion_tokens, "new_request": refused}


def image_host(fixture):
    """A local HTTP server with an image, a redirect to it, a redirect loop, a large body, a slow
    answer and a 404; returns its base URL."""
    import http.server
    import threading

    image = (fixture / "inputs" / "wide.png").read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def send(self, status, body=b"", headers=()):
            self.send_response(status)
            for key, value in headers:
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/wide.png":
                self.send(200, image, [("Content-Type", "image/png")])
            elif self.path == "/redirect":
                self.send(302, headers=[("Location", "/wide.png")])
            elif self.path == "/loop":
                self.send(302, headers=[("Location", "/loop")])
            elif self.path == "/big":
                self.send(200, b"\0" * 300_000)
            elif self.path == "/slow":
                time.sleep(4)
                self.send(200, image)
            else:
                self.send(404, b"no such image")

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def image_request(client, args, url):
    message = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Describe this image."}]}]
    return client.chat.completions.create(model=args.model, messages=message, extra_body=IGNORE_EOS, **GREEDY)


def scenario_remote_public_only(client, args):
    """With --allow-remote-images alone, loopback hosts are refused by address or by name."""
    base = image_host(args.fixture)
    seen = {}
    for name, url in [("literal", base + "/wide.png"), ("name", base.replace("127.0.0.1", "localhost") + "/wide.png")]:
        message = expect_error(400, "image_fetch_failed", lambda: image_request(client, args, url))
        assert "not a public address" in message, message
        seen[name] = message
    return seen


def scenario_remote(client, args):
    """With private hosts allowed (the test's own loopback server): a fetched image answers as
    the same image inline; redirects are followed up to a limit; size, time and status caps."""
    base = image_host(args.fixture)
    inline = image_request(client, args, data_url(args.fixture / "inputs" / "wide.png")).choices[0].message.content
    seen = {
        "fetched": image_request(client, args, base + "/wide.png").choices[0].message.content,
        "redirected": image_request(client, args, base + "/redirect").choices[0].message.content,
    }
    assert seen["fetched"] == inline and seen["redirected"] == inline, (seen, inline)
    for path, needle in [("/loop", "redirects"), ("/big", "larger than"), ("/slow", "longer than"), ("/missing", "404")]:
        message = expect_error(400, "image_fetch_failed", lambda: image_request(client, args, base + path))
        assert needle in message, (path, message)
        seen[path] = message
    return seen


def scenario_completions(client, args):
    """/v1/completions: the text golden's rendered prompt, as text and as its token ids, greedy, whole and
    streamed, with logprobs; one prompt per request; what completions cannot honour is a 400 naming it."""
    golden = json.loads((args.fixture / "goldens" / "text_only.json").read_text())
    model = args.model
    params = {"max_tokens": 16, "temperature": 0, "extra_body": IGNORE_EOS}
    by_text = client.completions.create(model=model, prompt=golden["prompt"], logprobs=2, **params)
    by_ids = client.completions.create(model=model, prompt=golden["input_ids"], **params)
    one_in_list = client.completions.create(model=model, prompt=[golden["prompt"]], **params)
    choice = by_text.choices[0]
    assert by_text.object == "text_completion" and by_text.id.startswith("cmpl-"), by_text
    assert choice.finish_reason == "length", choice
    assert by_text.usage.prompt_tokens == golden["n_prompt_tokens"], by_text.usage
    assert by_text.usage.completion_tokens == 16, by_text.usage
    assert by_ids.choices[0].text == choice.text == one_in_list.choices[0].text, (by_ids, choice, one_in_list)
    assert by_ids.choices[0].logprobs is None, by_ids.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 16, lp
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset), lp.text_offset
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        # Greedy: the chosen token is the most likely one.
        assert 1 <= len(top) <= 2 and abs(chosen - max(top.values())) < 1e-6, (chosen, top)

    stream = client.completions.create(model=model, prompt=golden["prompt"], stream=True,
                                       stream_options={"include_usage": True}, **params)
    pieces, finish, usage = [], None, None
    for chunk in stream:
        assert chunk.object == "text_completion", chunk
        if chunk.usage is not None:
            assert chunk.choices == [], chunk
            usage = chunk.usage
            continue
        pieces.append(chunk.choices[0].text)
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "length" and usage is not None and usage.completion_tokens == 16, (finish, usage)
    assert "".join(pieces) == choice.text, ("".join(pieces), choice.text)
    stop = choice.text[4:6]
    cut = client.completions.create(model=model, prompt=golden["prompt"], stop=stop, **params)
    assert cut.choices[0].finish_reason == "stop", cut
    assert cut.choices[0].text == choice.text[: choice.text.find(stop)], (cut, stop)

    errors = {
        "two_prompts": ("unsupported_value", dict(prompt=["a", "b"])),
        "echo": ("unsupported_value", dict(prompt="a", echo=True)),
        "suffix": ("unsupported_value", dict(prompt="a", suffix="z")),
        "best_of": ("unsupported_value", dict(prompt="a", best_of=2)),
        "n": ("unsupported_value", dict(prompt="a", n=2)),
        "token_out_of_vocabulary": ("invalid_value", dict(prompt=[1, 10**6])),
        "empty": ("empty_prompt", dict(prompt=[])),
        "unknown_field": ("invalid_json", dict(prompt="a", extra_body={"response_format": {"type": "json_object"}})),
    }
    refused = {}
    for name, (code, fields) in errors.items():
        refused[name] = expect_error(400, code, lambda: client.completions.create(model=model, max_tokens=2, **fields))
    return {"tokens": lp.tokens, "text": choice.text, "refused": refused}


def scenario_gateway_metrics(client, args):
    """The gauges an inference gateway routes by, scraped while 6 long streams share a 2-slot server:
    every scrape is consistent (running requests at most the slots, KV use within what they can hold),
    some scrape sees the slots full with requests waiting, and all return to zero at the end."""
    def gauges():
        with urllib.request.urlopen(args.base_url.removesuffix("/v1") + "/metrics") as response:
            text = response.read().decode()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def run(i):
        r = client.chat.completions.create(model=args.model, messages=[{"role": "user", "content": f"Story {i}."}],
                                           max_tokens=160, temperature=0, extra_body=IGNORE_EOS)
        return r.usage.completion_tokens

    scrapes = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        futures = [pool.submit(run, i) for i in range(6)]
        while not all(f.done() for f in futures):
            scrapes.append(gauges())
            time.sleep(0.005)
        tokens = [f.result() for f in futures]
    for g in scrapes:
        assert 0 <= g["mlxcel_active_slots"] <= 2, g
        assert 0 <= g["mlxcel_kv_cache_usage"] <= g["mlxcel_active_slots"] / 2, g
        assert (g["mlxcel_kv_cache_usage"] > 0) == (g["mlxcel_active_slots"] > 0), g
    busy = [g for g in scrapes if g["mlxcel_active_slots"] == 2 and g["mlxcel_queue_depth"] > 0]
    deadline = time.time() + 30
    while time.time() < deadline and gauges()["mlxcel_active_slots"] != 0:
        time.sleep(0.01)
    end = gauges()
    return {
        "tokens": tokens,
        "scrapes": len(scrapes),
        "busy_scrapes": len(busy),
        "max_usage": max(g["mlxcel_kv_cache_usage"] for g in scrapes),
        "end": {k: end[k] for k in ("mlxcel_queue_depth", "mlxcel_active_slots", "mlxcel_kv_cache_usage")},
    }


def scenario_disconnects(client, args):
    """Clients that go away: 4 that send a request's headers and part of its body and close the
    connection (mid-upload), 4 that read two chunks of a stream and close it (mid-stream), 2 that
    connect and send nothing. Then the golden image request still gives its tokens, and the gauges
    (open requests, running requests, queue, KV rows) return to zero: nothing of theirs is held."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(args.base_url)
    golden = json.loads((args.fixture / "goldens" / "image.json").read_text())
    body = json.dumps({"model": args.model, "messages": golden_messages(args.fixture, golden),
                       "max_tokens": 16}).encode()

    def partial_upload(i):
        with socket.create_connection((url.hostname, url.port)) as sock:
            head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.hostname}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
            sock.sendall(head + body[: len(body) // (2 + i)])

    def idle(_):
        with socket.create_connection((url.hostname, url.port)):
            time.sleep(0.05)

    def mid_stream(i):
        stream = client.chat.completions.create(
            model=args.model, messages=[{"role": "user", "content": f"Tell a long story {i}."}],
            max_tokens=200, temperature=0, stream=True, extra_body=IGNORE_EOS)
        chunks = 0
        for _ in stream:
            chunks += 1
            if chunks == 2:
                break
        stream.response.close()
        return chunks

    with concurrent.futures.ThreadPoolExecutor(max_workers=10) as pool:
        jobs = [pool.submit(partial_upload, i) for i in range(4)] + [pool.submit(idle, i) for i in range(2)]
        streams = [pool.submit(mid_stream, i) for i in range(4)]
        for j in jobs:
            j.result()
        read = [s.result() for s in streams]

    r = client.chat.completions.create(model=args.model, messages=golden_messages(args.fixture, golden),
                                       logprobs=True, extra_body=IGNORE_EOS, **GREEDY)
    tokens = [e.token for e in r.choices[0].logprobs.content]

    def gauges():
        with urllib.request.urlopen(args.base_url.removesuffix("/v1") + "/metrics") as response:
            text = response.read().decode()
        return {n: float(v) for n, v in (line.rsplit(" ", 1) for line in text.splitlines()
                                         if line and not line.startswith("#") and "{" not in line)}

    names = ("mlxcel_requests_open", "mlxcel_active_slots", "mlxcel_queue_depth", "mlxcel_kv_cache_usage")
    deadline = time.time() + 30
    end = gauges()
    while time.time() < deadline and any(end[n] != 0 for n in names):
        time.sleep(0.05)
        end = gauges()
    return {"streams_read": read, "golden_tokens": tokens, "end": {n: end[n] for n in names}}


API_KEY = "sk-mlxcel-test-key"


def scenario_api_key(client, args):
    """A server started with an API key: the openai client without it gets OpenAI's 401, with it the
    answer; /health stays open and /metrics asks for the key."""
    model = args.model
    messages = [{"role": "user", "content": "Say hello."}]
    refused = expect_error(401, "invalid_api_key",
                           lambda: client.chat.completions.create(model=model, messages=messages, max_tokens=2))
    expect_error(401, "invalid_api_key", lambda: client.models.list())
    wrong = openai.OpenAI(base_url=args.base_url, api_key=API_KEY + "x", timeout=300, max_retries=0)
    expect_error(401, "invalid_api_key",
                 lambda: wrong.chat.completions.create(model=model, messages=messages, max_tokens=2, stream=True))
    keyed = openai.OpenAI(base_url=args.base_url, api_key=API_KEY, timeout=300, max_retries=0)
    whole = keyed.chat.completions.create(model=model, messages=messages, max_tokens=3, temperature=0)
    streamed = "".join(c.choices[0].delta.content or "" for c in keyed.chat.completions.create(
        model=model, messages=messages, max_tokens=3, temperature=0, stream=True) if c.choices)
    models = [m.id for m in keyed.models.list()]

    base = args.base_url.removesuffix("/v1")

    def get(path, key=None):
        request = urllib.request.Request(base + path)
        if key:
            request.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(request) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    metrics_status, _ = get("/metrics")
    keyed_metrics_status, metrics_text = get("/metrics", API_KEY)
    unauthorized = 0.0
    for line in metrics_text.splitlines():
        if 'outcome="unauthorized"' in line:
            unauthorized = float(line.rsplit(" ", 1)[1])
    return {
        "refused_message": refused,
        "whole": whole.choices[0].message.content,
        "whole_tokens": whole.usage.completion_tokens,
        "streamed": streamed,
        "models": models,
        "health": get("/health")[0],
        "probes": [get("/live")[0], get("/ready")[0]],
        "metrics_without_key": metrics_status,
        "metrics_with_key": keyed_metrics_status,
        "unauthorized": unauthorized,
    }


def matches(schema, value, path="$"):
    """The JSON Schema subset the structured scenario uses (type, enum, properties, required,
    additionalProperties, items, minItems/maxItems, minimum/maximum, minLength/maxLength): an
    assertion naming the first place the value breaks it."""
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    kind = schema.get("type")
    if kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), f"{path}: {value!r} is not an integer"
    elif kind == "number":
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{path}: {value!r} is not a number"
    elif kind is not None:
        assert isinstance(value, kinds[kind]), f"{path}: {value!r} is not {kind}"
    if "enum" in schema:
        assert value in schema["enum"], f"{path}: {value!r} not in {schema['enum']}"
    if "minimum" in schema:
        assert value >= schema["minimum"], f"{path}: {value!r} < {schema['minimum']}"
    if "maximum" in schema:
        assert value <= schema["maximum"], f"{path}: {value!r} > {schema['maximum']}"
    if isinstance(value, str):
        assert schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", 1 << 30), f"{path}: length {len(value)}"
    if isinstance(value, list):
        assert schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", 1 << 30), f"{path}: {len(value)} items"
        for i, item in enumerate(value):
            matches(schema.get("items", {}), item, f"{path}[{i}]")
    if isinstance(value, dict) and kind == "object":
        for key in schema.get("required", []):
            assert key in value, f"{path}: `{key}` missing"
        props = schema.get("properties", {})
        for key, item in value.items():
            if key in props:
                matches(props[key], item, f"{path}.{key}")
            else:
                assert schema.get("additionalProperties", True) is not False, f"{path}: `{key}` is not allowed"


STRUCTURED_SCHEMAS = {
    "pet": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 8},
            "kind": {"enum": ["cat", "dog", "bird"]},
            "age": {"type": "integer", "minimum": 0, "maximum": 30},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
            "owner": {
                "type": "object",
                "properties": {"vip": {"type": "boolean"}, "score": {"type": "integer", "minimum": -5, "maximum": 5}},
                "required": ["vip", "score"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "kind", "age", "tags", "owner"],
        "additionalProperties": False,
    },
    "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 4},
    "verdict": {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
        "required": ["answer", "sure"],
        "additionalProperties": False,
    },
}


def scenario_structured(client, args):
    """response_format json_schema and json_object: every answer, whole or streamed, greedy or sampled (with
    top_p, penalties and logit_bias), text or image prompt, alone or inside a batch beside free requests,
    parses and matches its schema; a stop string still cuts the constrained text; schemas that cannot be
    followed and formats that do not exist are 400s naming response_format."""
    wide = data_url(args.fixture / "inputs" / "wide.png")
    text_prompt = [{"role": "user", "content": "Describe a pet as JSON."}]
    image_prompt = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": wide}}, {"type": "text", "text": "What is in it, as JSON?"}]}]

    def fmt(name):
        return {"type": "json_schema", "json_schema": {"name": name, "schema": STRUCTURED_SCHEMAS[name], "strict": True}}

    def ask(case):
        name, messages, stream, params = case
        kwargs = dict(model=args.model, messages=messages, max_tokens=160, response_format=fmt(name))
        kwargs.update(params)
        if not stream:
            choice = client.chat.completions.create(**kwargs).choices[0]
            return choice.message.content, choice.finish_reason
        text, finish = "", None
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        return text, finish

    sampled = {"temperature": 1.0, "top_p": 0.9, "seed": 11, "frequency_penalty": 0.5, "presence_penalty": 0.3}
    cases = []
    for name in STRUCTURED_SCHEMAS:
        for messages in (text_prompt, image_prompt):
            for stream in (False, True):
                cases.append((name, messages, stream, {"temperature": 0}))
                cases.append((name, messages, stream, dict(sampled)))
    cases.append(("pet", text_prompt, False,
                  {"temperature": 0.7, "seed": 3, "extra_body": {"repetition_penalty": 1.3, "top_k": 20}}))
    seen = {}
    # Each alone, then all at once with unconstrained requests between them: the same text.
    alone = [ask(c) for c in cases]
    for (name, messages, stream, params), (text, finish) in zip(cases, alone):
        assert finish == "stop", (name, stream, params, text, finish)
        matches(STRUCTURED_SCHEMAS[name], json.loads(text))
    free = lambda: client.chat.completions.create(model=args.model, messages=text_prompt, max_tokens=24,
                                                  temperature=0).choices[0].message.content
    free_alone = free()
    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        frees = [pool.submit(free) for _ in range(3)]
        together = list(pool.map(ask, cases))
        free_texts = {f.result() for f in frees}
    assert together == alone, [(c[0], a, t) for c, a, t in zip(cases, alone, together) if a != t]
    # The unconstrained requests beside them answer as alone.
    assert free_texts == {free_alone}, (free_texts, free_alone)
    seen["documents"] = [text for text, _ in alone]
    seen["free"] = sorted(free_texts)
    # Greedy constrained answers differ from the unconstrained one: the grammar did something.
    assert all(text not in free_texts for text, _ in alone)

    # json_object: any object; a logit_bias still composes (it can only pick among what the grammar allows).
    obj = client.chat.completions.create(model=args.model, messages=text_prompt, max_tokens=160, temperature=0,
                                         response_format={"type": "json_object"}, logit_bias=CLOSE_BIAS)
    assert obj.choices[0].finish_reason == "stop", obj
    seen["json_object"] = obj.choices[0].message.content
    assert isinstance(json.loads(seen["json_object"]), dict), seen["json_object"]

    # A stop string cuts the constrained text where it first appears (the answer is then not whole JSON).
    whole = alone[0][0]
    cut = whole.index(",")
    stopped = client.chat.completions.create(model=args.model, messages=text_prompt, max_tokens=160, temperature=0,
                                             response_format=fmt("pet"), stop=[","])
    assert stopped.choices[0].message.content == whole[:cut], (stopped.choices[0].message.content, whole)
    assert stopped.choices[0].finish_reason == "stop"

    bad = lambda rf, **kw: lambda: client.chat.completions.create(model=args.model, messages=text_prompt, max_tokens=4,
                                                                  response_format=rf, **kw)
    seen["bad_ref"] = expect_error(400, "invalid_value", bad(
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}}))
    seen["unknown_type"] = expect_error(400, "invalid_json", bad({"type": "yaml"}))
    seen["no_name"] = expect_error(400, "invalid_value", bad({"type": "json_schema", "json_schema": {"name": ""}}))
    seen["ignore_eos"] = expect_error(400, "invalid_value", bad({"type": "json_object"}, extra_body=IGNORE_EOS))
    return seen


# Token ids of the fixture tokenizer's `}` and `"`, pushed up so a random model's object closes soon.
CLOSE_BIAS = {"92": 8, "1": 3}


def scenario_tools(client, args):
    """Tool calls with the hermes template fixture (tests/fixtures/tool_templates/hermes, served over the
    Qwen2.5-VL fixture): tools, past calls and results rendered (prompt tokens reported for the test to hold
    against transformers' rendering); tool_choice required and a named function force calls, whole and
    streamed, one or several; each call's arguments match its function's schema; the answer goes back as a
    turn; auto and none answer as the model writes; what cannot be honoured is a 400 naming it."""
    request = json.loads((args.fixture / "request.json").read_text())
    tools, history = request["tools"], request["messages"]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    create = lambda **kw: client.chat.completions.create(model=args.model, **kw)
    seen = {}

    shown = create(messages=history, tools=tools, tool_choice="none", max_tokens=1, temperature=0)
    assert shown.choices[0].message.tool_calls is None, shown
    seen["history_prompt_tokens"] = shown.usage.prompt_tokens

    def streamed(**kw):
        calls, content, finish = {}, "", None
        for chunk in create(stream=True, **kw):
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            content += delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
            for d in delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                if d.id:
                    call["id"] = d.id
                if d.function and d.function.name:
                    call["name"] = d.function.name
                if d.function and d.function.arguments:
                    call["arguments"] += d.function.arguments
        return [calls[i] for i in sorted(calls)], content, finish

    forced = [("required", False, {"temperature": 0}), ("required", True, {"temperature": 0}),
              ("required", False, {"temperature": 1.0, "seed": 5, "top_p": 0.95}),
              ({"type": "function", "function": {"name": "pick"}}, True, {"temperature": 0})]
    seen["forced"] = []
    for choice, parallel, params in forced:
        kw = dict(messages=ask, tools=tools, tool_choice=choice, parallel_tool_calls=parallel, max_tokens=240, **params)
        whole = create(**kw).choices[0]
        assert whole.message.tool_calls, whole
        if parallel:
            # This random model chains calls until the token limit; what it finished are calls, the call
            # cut short stays text (as any answer cut by max_tokens).
            assert whole.finish_reason in ("tool_calls", "length"), whole
        else:
            assert whole.finish_reason == "tool_calls" and whole.message.content is None, whole
            assert len(whole.message.tool_calls) == 1, whole
        for call in whole.message.tool_calls:
            assert call.type == "function" and call.id.startswith("call_"), call
            if isinstance(choice, dict):
                assert call.function.name == "pick", call
            matches(schemas[call.function.name], json.loads(call.function.arguments))
        calls, content, finish = streamed(**kw)
        assert finish == whole.finish_reason and content.strip() == (whole.message.content or "").strip(), (finish, content)
        got = [(c["name"], c["arguments"]) for c in calls]
        want = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
        assert got == want, (got, want)
        assert all(c["id"] and c["id"].startswith("call_") for c in calls), calls
        seen["forced"].append(want)

    # An image in the question: the same forced call, whole and streamed.
    wide = data_url(args.fixture / "inputs" / "wide.png")
    look = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": wide}},
                                         {"type": "text", "text": "Pick a number for this."}]}]
    kw = dict(messages=look, tools=tools, tool_choice={"type": "function", "function": {"name": "pick"}},
              parallel_tool_calls=False, max_tokens=120, temperature=0)
    whole = create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls" and len(whole.message.tool_calls) == 1, whole
    matches(schemas["pick"], json.loads(whole.message.tool_calls[0].function.arguments))
    calls, content, finish = streamed(**kw)
    assert finish == "tool_calls" and [(c["name"], c["arguments"]) for c in calls] == [
        ("pick", whole.message.tool_calls[0].function.arguments)], (calls, whole)
    seen["image_call"] = whole.message.tool_calls[0].function.arguments

    # The answer goes back with its result; the next turn is served.
    first = create(messages=ask, tools=tools, tool_choice="required", parallel_tool_calls=False, max_tokens=240,
                   temperature=0).choices[0].message
    call = first.tool_calls[0]
    turn = ask + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "{\"temp\": 21}"}]
    after = create(messages=turn, tools=tools, max_tokens=8, temperature=0)
    assert after.usage.prompt_tokens > shown.usage.prompt_tokens // 2, after
    seen["after_finish"] = after.choices[0].finish_reason

    # auto: whatever the model writes; without calls, text and `stop` or `length`.
    auto = create(messages=ask, tools=tools, max_tokens=16, temperature=0).choices[0]
    assert auto.finish_reason in ("stop", "length", "tool_calls"), auto
    assert (auto.finish_reason == "tool_calls") == bool(auto.message.tool_calls), auto

    bad = lambda **kw: lambda: create(messages=ask, max_tokens=4, **kw)
    seen["unknown_named"] = expect_error(400, "invalid_value", bad(
        tools=tools, tool_choice={"type": "function", "function": {"name": "nope"}}))
    seen["choice_without_tools"] = expect_error(400, "invalid_value", bad(tool_choice="required"))
    seen["with_json"] = expect_error(400, "unsupported_value", bad(
        tools=tools, tool_choice="required", response_format={"type": "json_object"}))
    seen["bad_arguments"] = expect_error(400, "invalid_value", lambda: create(max_tokens=4, messages=ask + [
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "pick", "arguments": "{oops"}}]}]))
    seen["tool_without_id"] = expect_error(400, "invalid_value", lambda: create(max_tokens=4, messages=ask + [
        {"role": "tool", "content": "x"}]))
    return seen


def scenario_tools_undeclared(client, args):
    """A family whose manifest declares no tool-call syntax (or a template that renders no tools): tools the
    model may call are refused naming `tools`; tool_choice none only shows them."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    ask = [{"role": "user", "content": "hi"}]
    seen = {"refused": expect_error(400, "unsupported_value", lambda: client.chat.completions.create(
        model=args.model, messages=ask, tools=tools, max_tokens=2))}
    none = client.chat.completions.create(model=args.model, messages=ask, tools=tools, tool_choice="none", max_tokens=2)
    assert none.choices[0].message.tool_calls is None
    return seen


def scenario_checkpoint_changed(client, args):
    """Issue 27: a request answers; then the test rewrites a weight file under the running server. Every
    later request is a 503 `checkpoint_changed` naming the file (never an answer from weights nobody chose),
    /ready fails while /live answers, and so does a streamed request."""
    hi = [{"role": "user", "content": "hi"}]
    before = client.chat.completions.create(model=args.model, messages=hi, max_tokens=2, temperature=0)
    assert before.choices[0].message.content is not None
    marker = args.fixture / "rewrite-now"
    marker.write_text("")
    deadline = time.time() + 30
    while marker.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert not marker.exists(), "the test never rewrote the weights"
    seen = {"whole": expect_error(503, "checkpoint_changed", lambda: client.chat.completions.create(
        model=args.model, messages=hi, max_tokens=2))}
    seen["stream"] = expect_error(503, "checkpoint_changed", lambda: list(client.chat.completions.create(
        model=args.model, messages=hi, max_tokens=2, stream=True)))
    root = args.base_url.rsplit("/v1", 1)[0]
    try:
        urllib.request.urlopen(root + "/ready")
        raise AssertionError("/ready answered 200")
    except urllib.error.HTTPError as e:
        assert e.code == 503, e.code
        seen["ready"] = json.loads(e.read())
    assert urllib.request.urlopen(root + "/live").status == 200
    return seen


def noise_png(width, height, seed):
    """An RGB PNG of width x height random pixels (which do not compress: the file is about 3 bytes a pixel)."""
    import random

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = random.Random(seed).randbytes
    rows = b"".join(b"\0" + pixels(3 * width) for _ in range(height))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def gauges(base_url):
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics") as response:
        text = response.read().decode()
    return {n: float(v) for n, v in (line.rsplit(" ", 1) for line in text.splitlines()
                                     if line and not line.startswith("#") and "{" not in line)}


def ready(base_url):
    try:
        with urllib.request.urlopen(base_url.removesuffix("/v1") + "/ready") as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def scenario_plugin_faults(client, args):
    """Issue 27, a plugin at fault (plugins/testkit/faulty: Qwen2-VL that misbehaves on images of chosen
    widths), on a server with one preparation worker, a 2 s preparation deadline and 10 KiB of media in
    flight. While a long stream decodes: a panic, a NaN in the pixel values and a tensor short of its shape
    are each a 500 naming the plugin's fault; a call stuck past the deadline is a 500 `deadline_exceeded`
    at the deadline, counts as overdue (so /ready fails, one worker being stuck) and keeps its file's bytes
    held until its code returns, so an image that does not fit beside it is a 429 while the golden image
    request is still answered; media over the whole budget is a 413. The stream ends whole and every gauge
    returns to zero."""
    golden = json.loads((args.fixture / "goldens" / "image.json").read_text())
    files = {}

    def image(width, height=40):
        files[width] = noise_png(width, height, width)
        url = "data:image/png;base64," + base64.b64encode(files[width]).decode()
        return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "What is this?"}]}]

    def stream():
        chunks = client.chat.completions.create(
            model=args.model, messages=[{"role": "user", "content": "Tell a long story."}],
            max_tokens=120, temperature=0, stream=True, extra_body=IGNORE_EOS,
            stream_options={"include_usage": True})
        usage, finish = None, None
        for chunk in chunks:
            if chunk.usage:
                usage = chunk.usage.completion_tokens
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        return usage, finish

    seen = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        running = pool.submit(stream)
        for name, width in [("panic", 61), ("nan", 63), ("short", 65)]:
            seen[name] = expect_error(500, "media_failed", lambda: client.chat.completions.create(
                model=args.model, messages=image(width), max_tokens=4))
        started = time.time()
        seen["stall"] = expect_error(500, "deadline_exceeded", lambda: client.chat.completions.create(
            model=args.model, messages=image(62), max_tokens=4))
        seen["stall_seconds"] = time.time() - started
        during = gauges(args.base_url)
        seen["overdue_after_deadline"] = during["mlxcel_preparations_overdue"]
        seen["held_after_deadline"] = [int(during["mlxcel_media_bytes_held"]), len(files[62])]
        seen["ready_while_overdue"] = ready(args.base_url)
        seen["beside_the_stalled"] = expect_error(429, "media_budget_full", lambda: client.chat.completions.create(
            model=args.model, messages=image(64, 20), max_tokens=4))
        seen["over_the_budget"] = expect_error(413, "media_too_large", lambda: client.chat.completions.create(
            model=args.model, messages=image(68, 60), max_tokens=4))
        r = client.chat.completions.create(model=args.model, messages=golden_messages(args.fixture, golden),
                                           logprobs=True, extra_body=IGNORE_EOS, **GREEDY)
        seen["golden_tokens"] = [e.token for e in r.choices[0].logprobs.content]
        seen["stream"] = running.result()

    names = ("mlxcel_requests_open", "mlxcel_active_slots", "mlxcel_queue_depth", "mlxcel_kv_cache_usage",
             "mlxcel_preparations_overdue", "mlxcel_media_bytes_held")
    deadline = time.time() + 30
    end = gauges(args.base_url)
    while time.time() < deadline and any(end[n] != 0 for n in names):
        time.sleep(0.1)
        end = gauges(args.base_url)
    seen["end"] = {n: end[n] for n in names}
    seen["ready_at_end"] = ready(args.base_url)
    return seen


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--fixture", type=Path, required=True)
    parser.add_argument("--model", default="qwen2_vl")
    parser.add_argument("--server-pid", type=int)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", timeout=300, max_retries=0)
    result = globals()["scenario_" + args.scenario](client, args)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
