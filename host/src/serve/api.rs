//! The OpenAI chat-completions wire format: what a request may say (anything else is refused,
//! never ignored), the response and stream-chunk bodies, and OpenAI-style errors.

use http::StatusCode;
use serde::{Deserialize, Serialize};

/// `POST /v1/chat/completions`. Unknown fields are refused: a field the server does not act on
/// must not be silently dropped.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChatRequest {
    pub(crate) model: String,
    pub(crate) messages: Vec<ChatMessage>,
    #[serde(default)]
    pub(crate) stream: bool,
    pub(crate) stream_options: Option<StreamOptions>,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) max_completion_tokens: Option<u64>,
    pub(crate) temperature: Option<f32>,
    pub(crate) top_p: Option<f32>,
    /// Extension (vLLM's name): keep only the k most likely tokens.
    pub(crate) top_k: Option<i64>,
    /// Extension: drop tokens less likely than this fraction of the most likely one.
    pub(crate) min_p: Option<f32>,
    /// Extension: transformers' repetition penalty over prompt and generated tokens.
    pub(crate) repetition_penalty: Option<f32>,
    pub(crate) frequency_penalty: Option<f32>,
    pub(crate) presence_penalty: Option<f32>,
    pub(crate) seed: Option<i64>,
    pub(crate) stop: Option<StopField>,
    /// Extension: token ids that also end the request.
    #[serde(default)]
    pub(crate) stop_token_ids: Vec<u32>,
    /// Extension: keep generating past the checkpoint's end-of-sequence tokens.
    #[serde(default)]
    pub(crate) ignore_eos: bool,
    #[serde(default)]
    pub(crate) logprobs: bool,
    pub(crate) top_logprobs: Option<u32>,
    pub(crate) n: Option<u32>,
    /// OpenAI's bias per token id (a decimal string), in [-100, 100], added to the logits.
    pub(crate) logit_bias: Option<std::collections::BTreeMap<String, f32>>,
    /// Accepted for compatibility; identifies the caller only.
    #[allow(dead_code)]
    pub(crate) user: Option<String>,
    /// Structured output: the answer is JSON (any object, or a document of a schema),
    /// enforced token by token.
    pub(crate) response_format: Option<ResponseFormat>,
    /// Functions the model may call, each `{"type": "function", "function": {...}}`, kept as
    /// sent (the template renders them in the client's key order; `serve::tools` checks them).
    pub(crate) tools: Option<Vec<serde_json::Value>>,
    /// `none`, `auto`, `required`, or `{"type": "function", "function": {"name": ...}}`.
    pub(crate) tool_choice: Option<serde_json::Value>,
    /// Fields that change nothing about the output, accepted and logged (README: "What a
    /// request may say"): whether OpenAI stores the completion (nothing is stored here), its
    /// tags and the processing tier. `parallel_tool_calls: false` allows one call per answer.
    pub(crate) store: Option<bool>,
    #[allow(dead_code)]
    pub(crate) metadata: Option<std::collections::BTreeMap<String, String>>,
    pub(crate) service_tier: Option<String>,
    pub(crate) parallel_tool_calls: Option<bool>,
}

/// OpenAI's `response_format`.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum ResponseFormat {
    /// Free text, as without the field.
    Text,
    /// Any JSON object.
    JsonObject,
    /// A JSON document of the given schema.
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// `response_format.json_schema`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct JsonSchemaFormat {
    /// The schema's name: it names the schema in errors; the output does not depend on it.
    pub(crate) name: String,
    #[allow(dead_code)]
    pub(crate) description: Option<String>,
    /// Absent: any JSON value, as OpenAI reads a schema-less format.
    pub(crate) schema: Option<serde_json::Value>,
    /// OpenAI's strict mode. The schema is enforced either way (a grammar cannot follow a
    /// schema loosely), so `false` is served as `true`.
    #[allow(dead_code)]
    pub(crate) strict: Option<bool>,
}

/// `POST /v1/completions` (OpenAI's legacy text completions, which inference gateways route):
/// one prompt, as text or token ids. Unknown fields are refused, as for chat. The generation
/// fields repeat [`ChatRequest`]'s because serde cannot refuse unknown fields of a struct that
/// flattens another; [`CompletionRequest::into_parts`] hands them to the one place that checks
/// them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompletionRequest {
    pub(crate) model: String,
    pub(crate) prompt: PromptField,
    #[serde(default)]
    pub(crate) stream: bool,
    pub(crate) stream_options: Option<StreamOptions>,
    /// OpenAI's default for completions is 16.
    pub(crate) max_tokens: Option<u64>,
    pub(crate) temperature: Option<f32>,
    pub(crate) top_p: Option<f32>,
    pub(crate) top_k: Option<i64>,
    pub(crate) min_p: Option<f32>,
    pub(crate) repetition_penalty: Option<f32>,
    pub(crate) frequency_penalty: Option<f32>,
    pub(crate) presence_penalty: Option<f32>,
    pub(crate) seed: Option<i64>,
    pub(crate) stop: Option<StopField>,
    #[serde(default)]
    pub(crate) stop_token_ids: Vec<u32>,
    #[serde(default)]
    pub(crate) ignore_eos: bool,
    /// How many most likely tokens to report beside each chosen one (0 reports the chosen one's
    /// log-probability alone); absent reports none.
    pub(crate) logprobs: Option<u32>,
    pub(crate) n: Option<u32>,
    /// Only 1: one completion is generated per request.
    pub(crate) best_of: Option<u32>,
    /// Only `false`: the prompt is not repeated in the answer.
    #[serde(default)]
    pub(crate) echo: bool,
    /// Refused: no text is generated to fit before a suffix.
    pub(crate) suffix: Option<String>,
    pub(crate) logit_bias: Option<std::collections::BTreeMap<String, f32>>,
    pub(crate) user: Option<String>,
}

impl CompletionRequest {
    /// The prompt, and the generation fields as a chat request carries them (no messages), so
    /// both endpoints check them in one place.
    pub(crate) fn into_parts(self) -> (PromptField, ChatRequest) {
        let logprobs = self.logprobs.is_some();
        let chat = ChatRequest {
            model: self.model,
            messages: Vec::new(),
            stream: self.stream,
            stream_options: self.stream_options,
            max_tokens: Some(self.max_tokens.unwrap_or(16)),
            max_completion_tokens: None,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            seed: self.seed,
            stop: self.stop,
            stop_token_ids: self.stop_token_ids,
            ignore_eos: self.ignore_eos,
            logprobs,
            top_logprobs: self.logprobs,
            n: self.n,
            logit_bias: self.logit_bias,
            user: self.user,
            response_format: None,
            tools: None,
            tool_choice: None,
            store: None,
            metadata: None,
            service_tier: None,
            parallel_tool_calls: None,
        };
        (self.prompt, chat)
    }
}

/// A completion's prompt: text or token ids, or a list holding exactly one of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum PromptField {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Debug, Serialize)]
pub(crate) struct Completion {
    pub(crate) id: String,
    pub(crate) object: &'static str,
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) usage: Option<UsageBody>,
}

#[derive(Debug, Serialize)]
pub(crate) struct CompletionChoice {
    pub(crate) index: u32,
    pub(crate) text: String,
    pub(crate) finish_reason: Option<&'static str>,
    pub(crate) logprobs: Option<CompletionLogprobs>,
}

/// The completions API's log-probabilities: per generated token, its text, its log-probability,
/// the most likely tokens' (text to log-probability) and where its text starts in the answer.
#[derive(Debug, Default, Serialize)]
pub(crate) struct CompletionLogprobs {
    pub(crate) tokens: Vec<String>,
    pub(crate) token_logprobs: Vec<f32>,
    pub(crate) top_logprobs: Vec<std::collections::BTreeMap<String, f32>>,
    pub(crate) text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Adds one token's log-probabilities; its text starts at character `offset`.
    pub(crate) fn push(&mut self, token: TokenLogprobBody, offset: usize) {
        self.tokens.push(token.token);
        self.token_logprobs.push(token.logprob);
        // Two tokens may read the same (byte pieces of one character both read "\u{fffd}"): the
        // map keeps the likelier, which comes first.
        let mut top = std::collections::BTreeMap::new();
        for t in token.top_logprobs {
            top.entry(t.token).or_insert(t.logprob);
        }
        self.top_logprobs.push(top);
        self.text_offset.push(offset);
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    pub(crate) include_usage: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub(crate) fn into_vec(self) -> Vec<String> {
        match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChatMessage {
    pub(crate) role: String,
    pub(crate) content: Option<MessageContent>,
    /// An assistant turn's calls, as the API returned them.
    pub(crate) tool_calls: Option<Vec<ToolCallBody>>,
    /// A `tool` turn: the call it answers.
    pub(crate) tool_call_id: Option<String>,
    /// Accepted for compatibility (a participant's name); templates do not use it.
    #[allow(dead_code)]
    pub(crate) name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum ContentPart {
    Text { text: String },
    ImageUrl { image_url: ImageUrl },
    InputAudio { input_audio: InputAudio },
}

/// How finely an image is seen: OpenAI's `image_url.detail`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Detail {
    /// `auto`, `high` or none: the family's own resolution, bounded by the manifest's
    /// `limits.max_pixels_per_image`.
    #[default]
    Full,
    /// `low`: at most the manifest's `limits.low_detail_max_pixels`, through the family's own
    /// resize rule; where the manifest declares no such budget (a family of one input size),
    /// the family's only resolution.
    Low,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ImageUrl {
    pub(crate) url: String,
    /// OpenAI's resolution hint: `auto` and `high` are the family's own resolution, `low` its
    /// low-detail pixel budget ([`Detail`]); any other value is refused.
    pub(crate) detail: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InputAudio {
    /// The clip's bytes, base64.
    pub(crate) data: String,
    pub(crate) format: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct ChatCompletion {
    pub(crate) id: String,
    pub(crate) object: &'static str,
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) choices: Vec<Choice>,
    pub(crate) usage: UsageBody,
}

#[derive(Debug, Serialize)]
pub(crate) struct Choice {
    pub(crate) index: u32,
    pub(crate) message: AssistantMessage,
    pub(crate) finish_reason: &'static str,
    pub(crate) logprobs: Option<LogprobsBody>,
}

#[derive(Debug, Serialize)]
pub(crate) struct AssistantMessage {
    pub(crate) role: &'static str,
    /// `null` when the answer is only tool calls.
    pub(crate) content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) tool_calls: Vec<ToolCallBody>,
}

/// One tool call, in an answer or in a later request's assistant turn.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolCallBody {
    pub(crate) id: String,
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) function: FunctionCall,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct FunctionCall {
    pub(crate) name: String,
    /// The arguments as a JSON text (OpenAI's wire form).
    pub(crate) arguments: String,
}

/// A streamed tool call: the first delta of a call names it (`id`, `type`, `function.name`),
/// the next carry its arguments' text.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ToolCallDelta {
    pub(crate) index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<&'static str>,
    pub(crate) function: FunctionDelta,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<String>,
    pub(crate) arguments: String,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct UsageBody {
    pub(crate) prompt_tokens: usize,
    pub(crate) completion_tokens: usize,
    pub(crate) total_tokens: usize,
    pub(crate) prompt_tokens_details: PromptTokensDetails,
}

/// OpenAI's breakdown of the prompt: `cached_tokens` were kept from an earlier request's cache
/// (the prefix cache), not prefilled.
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct PromptTokensDetails {
    pub(crate) cached_tokens: usize,
}

impl UsageBody {
    pub(crate) fn new(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Self {
        UsageBody {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct LogprobsBody {
    pub(crate) content: Vec<TokenLogprobBody>,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct TokenLogprobBody {
    pub(crate) token: String,
    pub(crate) logprob: f32,
    pub(crate) bytes: Vec<u8>,
    pub(crate) top_logprobs: Vec<TopLogprobBody>,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct TopLogprobBody {
    pub(crate) token: String,
    pub(crate) logprob: f32,
    pub(crate) bytes: Vec<u8>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ChatChunk {
    pub(crate) id: String,
    pub(crate) object: &'static str,
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) usage: Option<UsageBody>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ChunkChoice {
    pub(crate) index: u32,
    pub(crate) delta: Delta,
    pub(crate) finish_reason: Option<&'static str>,
    pub(crate) logprobs: Option<LogprobsBody>,
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) tool_calls: Vec<ToolCallDelta>,
}

/// An OpenAI-style error: `{"error": {"message", "type", "param", "code"}}` with its status.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) kind: &'static str,
    pub(crate) code: &'static str,
    pub(crate) param: Option<&'static str>,
    pub(crate) message: String,
    /// Seconds for a `Retry-After` header (429 and 503).
    pub(crate) retry_after: Option<u64>,
}

impl ApiError {
    /// A 400 `invalid_request_error`.
    pub(crate) fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code,
            param: None,
            message: message.into(),
            retry_after: None,
        }
    }

    pub(crate) fn param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    pub(crate) fn status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// A 500: the server failed, not the request.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            code: "internal_error",
            param: None,
            message: message.into(),
            retry_after: None,
        }
    }

    pub(crate) fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}
