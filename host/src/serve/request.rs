//! A chat request's checks that need no server state: the messages as the template takes them
//! with their media sources (data URLs decoded), and the generation fields. Everything here is
//! a pure function of the request's JSON (and the model's vocabulary size), so `fuzz/` compiles
//! this file as it is (`chat_request`), with the wire format beside it.

use base64::Engine as _;
use mlxcel_plugin_api::Modality;

use super::api::{
    ApiError, ChatMessage, ChatRequest, ContentPart, Detail, MessageContent, ResponseFormat, ToolCallBody,
};
use super::text::{Content, Message, Part};

/// Stop strings a request may give.
pub(crate) const MAX_STOP_STRINGS: usize = 16;
/// `top_logprobs` at most, as OpenAI allows.
pub(crate) const MAX_TOP_LOGPROBS: u32 = 20;

/// Where an image's bytes come from.
#[derive(Debug)]
pub(crate) enum ImageSource {
    Inline(Vec<u8>),
    /// An http(s) URL, fetched when remote images are allowed.
    Remote(String),
}

/// An image or clip of a chat request: where its bytes come from and the detail it is seen at.
#[derive(Debug)]
pub(crate) struct ImagePart {
    pub(crate) source: ImageSource,
    pub(crate) detail: Detail,
    pub(crate) modality: Modality,
}

/// The generation fields of a chat request, checked; what needs the server (the sampler, the
/// grammar) is built from them.
#[derive(Debug)]
pub(crate) struct Fields {
    pub(crate) max_tokens: Option<usize>,
    /// 0 for none.
    pub(crate) top_k: usize,
    pub(crate) top_logprobs: Option<usize>,
    pub(crate) stop_strings: Vec<String>,
    pub(crate) logit_bias: Vec<(u32, f32)>,
    /// The JSON schema `response_format` asks the answer to follow, if any.
    pub(crate) schema: Option<serde_json::Value>,
}

/// Checks the generation fields of `r` for a model of `vocab` logits.
pub(crate) fn fields(r: &ChatRequest, vocab: usize) -> Result<Fields, ApiError> {
    if let Some(n) = r.n
        && n != 1
    {
        return Err(
            ApiError::invalid("unsupported_value", format!("n = {n}: one choice per request is served")).param("n")
        );
    }
    if r.stream_options.is_some() && !r.stream {
        return Err(ApiError::invalid("invalid_value", "stream_options needs stream: true").param("stream_options"));
    }
    let max_tokens = match (r.max_tokens, r.max_completion_tokens) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::invalid(
                "invalid_value",
                format!("max_tokens ({a}) and max_completion_tokens ({b}) disagree"),
            )
            .param("max_tokens"));
        }
        (a, b) => a.or(b).map(|m| usize::try_from(m).unwrap_or(usize::MAX)),
    };
    let top_k = match r.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => {
            return Err(
                ApiError::invalid("invalid_value", format!("top_k must be -1, 0 or positive, got {k}")).param("top_k")
            );
        }
    };
    let top_logprobs = match (r.logprobs, r.top_logprobs) {
        (false, Some(_)) => {
            return Err(ApiError::invalid("invalid_value", "top_logprobs needs logprobs: true").param("top_logprobs"));
        }
        (false, None) => None,
        (true, n) => {
            let n = n.unwrap_or(0);
            if n > MAX_TOP_LOGPROBS {
                return Err(ApiError::invalid(
                    "invalid_value",
                    format!("top_logprobs is at most {MAX_TOP_LOGPROBS}, got {n}"),
                )
                .param("top_logprobs"));
            }
            Some(n as usize)
        }
    };
    let stop_strings = r.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if stop_strings.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            "invalid_value",
            format!("{} stop strings; at most {MAX_STOP_STRINGS}", stop_strings.len()),
        )
        .param("stop"));
    }
    let schema = response_schema(r)?;
    if schema.is_some() && r.ignore_eos {
        return Err(ApiError::invalid(
            "invalid_value",
            "ignore_eos with a JSON response_format: the answer ends where the JSON ends",
        )
        .param("ignore_eos"));
    }
    Ok(Fields { max_tokens, top_k, top_logprobs, stop_strings, logit_bias: logit_bias(r, vocab)?, schema })
}

/// The schema `response_format` asks for: none for text, any JSON object for `json_object`,
/// the schema for `json_schema` (any JSON value when it gives none).
fn response_schema(r: &ChatRequest) -> Result<Option<serde_json::Value>, ApiError> {
    Ok(match &r.response_format {
        None | Some(ResponseFormat::Text) => None,
        Some(ResponseFormat::JsonObject) => Some(serde_json::json!({"type": "object"})),
        Some(ResponseFormat::JsonSchema { json_schema }) => {
            if json_schema.name.is_empty() || json_schema.name.len() > 64 {
                return Err(ApiError::invalid(
                    "invalid_value",
                    "response_format.json_schema.name must be 1 to 64 characters",
                )
                .param("response_format"));
            }
            Some(json_schema.schema.clone().unwrap_or_else(|| serde_json::json!({})))
        }
    })
}

/// The request's `logit_bias` as `(token, bias)`: each key a token id of the model's logits
/// (below `vocab`), written in decimal.
fn logit_bias(r: &ChatRequest, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(map) = &r.logit_bias else { return Ok(Vec::new()) };
    let mut out = Vec::with_capacity(map.len());
    for (key, &bias) in map {
        let token = key.trim().parse::<u32>().ok().filter(|&t| (t as usize) < vocab).ok_or_else(|| {
            ApiError::invalid(
                "invalid_value",
                format!(
                    "logit_bias key {key:?} is not a token id of this model's vocabulary (0 to {})",
                    vocab.saturating_sub(1)
                ),
            )
            .param("logit_bias")
        })?;
        out.push((token, bias));
    }
    Ok(out)
}

/// The chat turns for the template and the media in prompt order, from the wire format; a
/// remote image URL is taken only when `remote` (the server fetches them).
pub(crate) fn messages(wire: Vec<ChatMessage>, remote: bool) -> Result<(Vec<Message>, Vec<ImagePart>), ApiError> {
    let mut messages = Vec::new();
    let mut images = Vec::new();
    if wire.is_empty() {
        return Err(ApiError::invalid("empty_prompt", "messages is empty").param("messages"));
    }
    for m in wire {
        let role = match m.role.as_str() {
            "system" | "user" | "assistant" | "tool" => m.role,
            // OpenAI's newer name for the system turn.
            "developer" => "system".to_owned(),
            other => {
                return Err(ApiError::invalid(
                    "unsupported_value",
                    format!("role `{other}` is not served (system, developer, user, assistant and tool are)"),
                )
                .param("messages"));
            }
        };
        let tool_calls = template_calls(&role, m.tool_calls)?;
        if (role == "tool") != m.tool_call_id.is_some() {
            return Err(ApiError::invalid("invalid_value", "tool_call_id is given with, and only with, role `tool`")
                .param("messages"));
        }
        let content = match m.content {
            // Only tool calls: no content, as transformers hands such a turn to the template.
            None if tool_calls.is_some() => Content::Null,
            None => Content::Text(String::new()),
            Some(MessageContent::Text(text)) => Content::Text(text),
            Some(MessageContent::Parts(parts)) => {
                let mut out = Vec::new();
                for part in parts {
                    match part {
                        ContentPart::Text { text } => out.push(Part { kind: "text".to_owned(), text: Some(text) }),
                        ContentPart::ImageUrl { image_url } => {
                            // `auto` and `high` are the family's own resolution; `low` its
                            // low-detail pixel budget, or that same resolution (multimodal::Detail).
                            let detail = match image_url.detail.as_deref() {
                                None | Some("auto" | "high") => Detail::Full,
                                Some("low") => Detail::Low,
                                Some(other) => {
                                    return Err(ApiError::invalid(
                                        "invalid_value",
                                        format!("image_url.detail `{other}` is not one of auto, low and high"),
                                    )
                                    .param("messages"));
                                }
                            };
                            images.push(ImagePart {
                                source: image_source(&image_url.url, remote)?,
                                detail,
                                modality: Modality::Image,
                            });
                            out.push(Part { kind: "image".to_owned(), text: None });
                        }
                        ContentPart::InputAudio { input_audio } => {
                            // OpenAI's formats are wav and mp3; the family plugins decode WAV.
                            if input_audio.format != "wav" {
                                return Err(ApiError::invalid(
                                    "unsupported_audio_format",
                                    format!(
                                        "input_audio.format `{}` is not decoded; send the clip as wav",
                                        input_audio.format
                                    ),
                                )
                                .param("messages"));
                            }
                            let bytes = base64::engine::general_purpose::STANDARD
                                .decode(input_audio.data.trim())
                                .map_err(|e| {
                                    ApiError::invalid(
                                        "invalid_base64",
                                        format!("input_audio.data is not valid base64: {e}"),
                                    )
                                    .param("messages")
                                })?;
                            images.push(ImagePart {
                                source: ImageSource::Inline(bytes),
                                detail: Detail::Full,
                                modality: Modality::Audio,
                            });
                            out.push(Part { kind: "audio".to_owned(), text: None });
                        }
                    }
                }
                Content::Parts(out)
            }
        };
        messages.push(Message { role, content, tool_calls, tool_call_id: m.tool_call_id });
    }
    Ok((messages, images))
}

/// An assistant turn's calls as templates take them: each call's arguments an object (the
/// wire format sends them as JSON text).
fn template_calls(role: &str, calls: Option<Vec<ToolCallBody>>) -> Result<Option<Vec<serde_json::Value>>, ApiError> {
    let Some(calls) = calls else { return Ok(None) };
    if role != "assistant" {
        return Err(ApiError::invalid(
            "invalid_value",
            format!("tool_calls in a `{role}` turn; only assistant turns make calls"),
        )
        .param("messages"));
    }
    calls
        .into_iter()
        .map(|call| {
            let arguments: serde_json::Value = serde_json::from_str(&call.function.arguments).map_err(|e| {
                ApiError::invalid(
                    "invalid_value",
                    format!("the arguments of tool call `{}` are not JSON: {e}", call.id),
                )
                .param("messages")
            })?;
            Ok(serde_json::json!({
                "id": call.id,
                "type": call.kind,
                "function": {"name": call.function.name, "arguments": arguments},
            }))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// An image URL: a base64 data URL's bytes, or an http(s) URL when remote images are allowed.
fn image_source(url: &str, remote: bool) -> Result<ImageSource, ApiError> {
    if url.starts_with("http://") || url.starts_with("https://") {
        if remote {
            return Ok(ImageSource::Remote(url.to_owned()));
        }
        return Err(ApiError::invalid(
            "image_url_not_allowed",
            "remote image URLs are not fetched by this server (it runs without --allow-remote-images); send the image inline as a data URL (data:image/jpeg;base64,...: png, jpeg, webp or gif)",
        )
        .param("messages"));
    }
    let Some(rest) = url.strip_prefix("data:") else {
        return Err(ApiError::invalid(
            "invalid_image_url",
            "an image_url must be a data URL (data:image/jpeg;base64,...: png, jpeg, webp or gif)",
        )
        .param("messages"));
    };
    let Some((header, data)) = rest.split_once(',') else {
        return Err(ApiError::invalid("invalid_image_url", "the data URL has no `,` before its data").param("messages"));
    };
    if !header.ends_with(";base64") {
        return Err(ApiError::invalid("invalid_image_url", "the data URL is not base64 (`;base64,` expected)")
            .param("messages"));
    }
    base64::engine::general_purpose::STANDARD.decode(data.trim()).map(ImageSource::Inline).map_err(|e| {
        ApiError::invalid("invalid_base64", format!("the image data URL is not valid base64: {e}")).param("messages")
    })
}
