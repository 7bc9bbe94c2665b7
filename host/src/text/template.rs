//! The checkpoint's own chat template, rendered with minijinja the way
//! transformers' `apply_chat_template` renders it with jinja2: blocks trim
//! their newline and leading space, loop controls are on, the special tokens
//! of `tokenizer_config.json` are variables, and `raise_exception`, a
//! Python-compatible `tojson` and Python string and dict methods exist.

use std::path::Path;

use minijinja::{Environment, Error, ErrorKind, Value, value::Kwargs};

use super::{TextError, read_json_if_present};

/// One chat turn.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Message {
    pub role: String,
    pub content: Content,
    /// An assistant turn's tool calls, as transformers hands them to templates:
    /// `{"id", "type": "function", "function": {"name", "arguments": {...}}}`, the arguments an
    /// object, not the wire format's string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A `tool` turn: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// A turn's content: plain text, or the list of typed parts multimodal
/// templates iterate over (`{"type": "image"}`, `{"type": "text", "text": ...}`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
    /// No content (`None` to the template): an assistant turn that only calls tools.
    Null,
}

/// One part of a multimodal turn. Media parts carry only their type here:
/// the template writes a placeholder and the family plugin expands it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

impl Message {
    /// A plain-text turn.
    pub fn new(role: &str, text: &str) -> Self {
        Message { role: role.to_owned(), content: Content::Text(text.to_owned()), tool_calls: None, tool_call_id: None }
    }
}

/// A compiled chat template and the special tokens it may name.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// `bos_token`, `eos_token`, ... as the template sees them.
    specials: serde_json::Map<String, serde_json::Value>,
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// The template of the checkpoint at `dir`, where transformers looks for it, in its
    /// order: `chat_template.jinja` (what transformers 5 writes), the processor's legacy
    /// `chat_template.json` (`{"chat_template": ...}`, vision-language checkpoints on the Hub),
    /// then the `chat_template` of `tokenizer_config.json`.
    pub fn load(dir: &Path) -> Result<Self, TextError> {
        let config = read_json_if_present(&dir.join("tokenizer_config.json"))?.unwrap_or_default();
        let jinja = dir.join("chat_template.jinja");
        let source = if jinja.is_file() {
            std::fs::read_to_string(&jinja).map_err(|source| TextError::Io { path: jinja, source })?
        } else if let Some(processor) = read_json_if_present(&dir.join("chat_template.json"))? {
            config_template(&processor).ok_or(TextError::NoChatTemplate)?
        } else {
            config_template(&config).ok_or(TextError::NoChatTemplate)?
        };
        Self::from_source(&source, &config)
    }

    /// A template from its source and the tokenizer config holding its special tokens.
    pub fn from_source(source: &str, tokenizer_config: &serde_json::Value) -> Result<Self, TextError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, strip_generation_tags(source))?;
        let mut specials = serde_json::Map::new();
        if let Some(config) = tokenizer_config.as_object() {
            for key in config.keys().filter(|k| k.ends_with("_token")) {
                if let Some(token) = special_token(tokenizer_config, key) {
                    specials.insert(key.clone(), token.into());
                }
            }
            if let Some(extra) = config.get("additional_special_tokens") {
                specials.insert("additional_special_tokens".into(), extra.clone());
            }
        }
        Ok(ChatTemplate { env, specials })
    }

    /// The prompt for `messages`; with `add_generation_prompt`, ending
    /// where the assistant's reply begins.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String, TextError> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// [`ChatTemplate::render`] with the request's tool definitions as the template's `tools`
    /// (each `{"type": "function", "function": {...}}` as the client sent it, keys in its order,
    /// as transformers' `apply_chat_template(tools=...)` passes them).
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        // Messages go in as minijinja values so their keys keep field order for `tojson`.
        let mut ctx: std::collections::BTreeMap<&str, Value> =
            self.specials.iter().map(|(k, v)| (k.as_str(), Value::from_serialize(v))).collect();
        ctx.insert("messages", Value::from_serialize(messages));
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        // transformers passes these as None when absent, so `tools is not none` is false.
        ctx.insert("tools", tools.map_or(Value::from(()), Value::from_serialize));
        ctx.insert("documents", Value::from(()));
        Ok(self.env.get_template(NAME)?.render(ctx)?)
    }

    /// Whether the template reads `tools` at all: one that does not would drop a request's
    /// tools without a word.
    pub fn renders_tools(&self) -> bool {
        self.env.get_template(NAME).is_ok_and(|t| t.undeclared_variables(false).contains("tools"))
    }
}

/// `chat_template` of a tokenizer config: a string, or a list of named
/// templates of which the one named `default` applies.
fn config_template(config: &serde_json::Value) -> Option<String> {
    match config.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(named) => named
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_owned)),
        _ => None,
    }
}

/// A special token of a tokenizer config, written either as its string or
/// as an `AddedToken` object with a `content` field.
pub(super) fn special_token(config: &serde_json::Value, key: &str) -> Option<String> {
    match config.get(key)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// Removes transformers' `{% generation %}` / `{% endgeneration %}` tags
/// (they only mark assistant text for training masks; minijinja does not
/// know them).
fn strip_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        // The closing `%}` after the opening `{%` (in `{%}` the two overlap: no tag).
        let Some(len) = rest[start + 2..].find("%}").map(|n| n + 2) else { break };
        let tag = &rest[start..start + len + 2];
        let inner = tag[2..tag.len() - 2].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..start]);
        if inner != "generation" && inner != "endgeneration" {
            out.push_str(tag);
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
}

/// Prints `True`, `False` and `None` as Python does (jinja2 prints the
/// Python objects); everything else as minijinja prints it.
fn python_formatter(out: &mut minijinja::Output, state: &minijinja::State, value: &Value) -> Result<(), Error> {
    use minijinja::value::ValueKind;
    match value.kind() {
        ValueKind::Bool => out.write_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::None => out.write_str("None"),
        _ => return minijinja::escape_formatter(out, state, value),
    }
    .map_err(Error::from)
}

/// `strftime_now(format)`: the current UTC date and time, with the format
/// codes chat templates use (some write today's date with `%d %b %Y`).
fn strftime_now(format: String) -> Result<Value, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?
        .as_secs();
    strftime(&format, secs).map(Value::from)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Formats `secs` since the Unix epoch (UTC) like Python's `strftime`, for
/// `%Y %y %m %B %b %d %-d %A %a %H %M %S %%`.
fn strftime(format: &str, secs: u64) -> Result<String, Error> {
    let days = (secs / 86_400) as i64;
    let (h, mi, s) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let month = MONTHS[(m - 1) as usize];
    let weekday = DAYS[(days + 3).rem_euclid(7) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y % 100)),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('-') if chars.next() == Some('d') => out.push_str(&d.to_string()),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('M') => out.push_str(&format!("{mi:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported format code %{}", other.map(String::from).unwrap_or_default()),
                ));
            }
        }
    }
    Ok(out)
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `tojson` as transformers defines it: Python's `json.dumps` with
/// `ensure_ascii=False`, its `", "` and `": "` separators (`","` with an
/// indent), keys in insertion order unless `sort_keys`, and no HTML escaping
/// (minijinja's own `tojson` escapes `<`, `>`, `&` and `'`, which would
/// change prompts that embed JSON).
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&mut out, value, indent, sort_keys.unwrap_or(false), 0)?;
    Ok(Value::from_safe_string(out))
}

fn write_json(out: &mut String, v: &Value, indent: Option<usize>, sort: bool, depth: usize) -> Result<(), Error> {
    use minijinja::value::ValueKind;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => match i64::try_from(v.clone()) {
            Ok(i) if !v.to_string().contains('.') => out.push_str(&i.to_string()),
            _ => {
                let f = f64::try_from(v.clone())?;
                // Python writes floats with a fraction part (1.0) and NaN/Infinity bare.
                match f {
                    f if f.is_nan() => out.push_str("NaN"),
                    f if f.is_infinite() => out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" }),
                    f if f.fract() == 0.0 && f.abs() < 1e16 => out.push_str(&format!("{f:.1}")),
                    f => out.push_str(&f.to_string()),
                }
            }
        },
        ValueKind::String => out.push_str(&json_string(v.as_str().unwrap_or_default())),
        ValueKind::Map | ValueKind::Seq | ValueKind::Iterable => {
            let is_map = v.kind() == ValueKind::Map;
            // A map iterates over its keys.
            let mut items: Vec<Value> = v.try_iter()?.collect();
            if is_map && sort {
                items.sort();
            }
            out.push(if is_map { '{' } else { '[' });
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                if is_map {
                    out.push_str(&json_string(&item.to_string()));
                    out.push_str(": ");
                    write_json(out, &v.get_item(item)?, indent, sort, depth + 1)?;
                } else {
                    write_json(out, item, indent, sort, depth + 1)?;
                }
            }
            if !items.is_empty() {
                newline(out, depth);
            }
            out.push(if is_map { '}' } else { ']' });
        }
        _ => out.push_str(&json_string(&v.to_string())),
    }
    Ok(())
}

/// A JSON string literal with the escapes Python's `json` uses (non-ASCII kept).
fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// tests/fixtures/tool_templates/hermes (tools/oracle/gen_tool_template.py): a template
    /// rendering tools, past calls and their results gives transformers' prompt byte for byte.
    #[test]
    fn tools_calls_and_results_render_as_transformers_renders_them() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tool_templates/hermes");
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).expect("fixture file");
        let request: serde_json::Value = serde_json::from_str(&read("request.json")).expect("json");
        let mut wire = request["messages"].as_array().expect("messages").clone();
        // The arguments as templates take them: objects, not the wire's JSON text.
        for m in &mut wire {
            for call in m["tool_calls"].as_array_mut().into_iter().flatten() {
                let text = call["function"]["arguments"].as_str().expect("text").to_owned();
                call["function"]["arguments"] = serde_json::from_str(&text).expect("arguments");
            }
            if m["content"].is_null() {
                m["content"] = serde_json::Value::Null;
            }
        }
        let messages: Vec<Message> = serde_json::from_value(serde_json::Value::Array(wire)).expect("messages");
        assert_eq!(messages[2].content, Content::Null);
        let template =
            ChatTemplate::from_source(&read("chat_template.jinja"), &serde_json::json!({})).expect("compiles");
        assert!(template.renders_tools());
        let tools = request["tools"].as_array().expect("tools");
        let got = template.render_with_tools(&messages, Some(tools), true).expect("renders");
        assert_eq!(got, read("rendered.txt"));
        // A template that never reads `tools` says so.
        assert!(
            !ChatTemplate::from_source("{{ messages }}", &serde_json::json!({})).expect("compiles").renders_tools()
        );
    }

    fn render(source: &str, messages: &[Message]) -> Result<String, TextError> {
        let config = serde_json::json!({"bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": false}});
        ChatTemplate::from_source(source, &config)?.render(messages, true)
    }

    fn check(source: &str, want: &str) {
        let messages = [Message::new("system", "  be brief "), Message::new("user", "hi <there> & 'you'")];
        assert_eq!(render(source, &messages).expect("renders"), want, "{source}");
    }

    #[test]
    fn renders_like_transformers() {
        // Blocks trim their newline and indentation (trim_blocks, lstrip_blocks).
        check("{% for m in messages %}\n  {% if true %}{{ m.role }};{% endif %}\n{% endfor %}", "system;user;");
        check("{% for m in messages %}\n  {{ m.role }};\n{% endfor %}", "  system;\n  user;\n");
        check("{{ bos_token }}{{ messages[-1]['content'] }}{{ eos_token }}", "<s>hi <there> & 'you'</s>");
        check("{% if add_generation_prompt %}go{% endif %}", "go");
        // Python methods through pycompat.
        check("{{ messages[0].content.strip() }}|{{ messages[1].content.startswith('hi') }}", "be brief|True");
        check("{{ none }}|{{ 1.0 }}|{{ false }}|{{ undefined_name }}", "None|1.0|False|");
        check("{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{{ m.role }}{% endfor %}", "user");
        check("{% for m in messages %}{{ m.role }}{% break %}{% endfor %}", "system");
        check(
            "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
            "2",
        );
        check("{% generation %}{{ messages|length }}{% endgeneration %}", "2");
    }

    /// Idioms of Hub chat templates; each expectation is what transformers'
    /// jinja2 setup (`_compile_jinja_template`) rendered for these messages.
    #[test]
    fn hub_template_idioms_render_as_jinja2_does() {
        let messages = [
            Message::new("system", "You are X.  "),
            Message::new("user", "a, b; c\nd"),
            Message::new("assistant", "<think>\nhm\n</think>\n\nok"),
            Message::new("user", "é \"q\""),
        ];
        for (source, want) in [
            ("{%- for m in messages %}{{ loop.index0 }}{{ '|' if not loop.last }}{% endfor %}", "0|1|2|3"),
            (
                "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|join('#') }}",
                "a, b; c\nd#é \"q\"",
            ),
            (
                "{% for m in messages %}{% if m.content is string %}{{ m.content[:3] }}{% endif %}{% endfor %}",
                "Youa, <thé \"",
            ),
            ("{{ messages[2].content.split('</think>')[-1].lstrip('\\n') }}", "ok"),
            ("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", "a=1;b=2;"),
            ("{% if 'think' in messages[2].content %}T{% endif %}{{ messages[0].content.endswith('  ') }}", "TTrue"),
            (
                "{%- set ns = namespace(last=-1) %}{%- for m in messages[::-1] %}{%- if m.role == 'user' and ns.last == -1 %}\
                 {%- set ns.last = messages|length - 1 - loop.index0 %}{%- endif %}{%- endfor %}{{ ns.last }}",
                "3",
            ),
            (
                "{{ messages[0]['content'] | replace('X', 'Y') }}|{{ 'a b'.title() }}|{{ 'AbC'.lower() }}",
                "You are Y.  |A B|abc",
            ),
            (
                "{% for m in messages %}\n    {%- if m.role == 'user' %}\n        {{- '<u>' + m.content + '</u>' }}\n    \
                 {%- elif m.role == 'assistant' %}\n{{ m.content }}\n    {%- endif %}\n{% endfor %}",
                "<u>a, b; c\nd</u><think>\nhm\n</think>\n\nok<u>é \"q\"</u>",
            ),
            (
                "{{ (messages|first).role }}{{ (messages|last).role }}{{ messages[0].get('missing', 'z') }}",
                "systemuserz",
            ),
            ("{{ 3 // 2 }} {{ 7 % 3 }} {{ 2 ** 3 }} {{ 1 / 2 }} {{ foo|default('d') }}", "1 1 8 0.5 d"),
            (
                "{{ messages|tojson }}",
                r#"[{"role": "system", "content": "You are X.  "}, {"role": "user", "content": "a, b; c\nd"}, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nok"}, {"role": "user", "content": "é \"q\""}]"#,
            ),
        ] {
            assert_eq!(render(source, &messages).expect("renders"), want, "{source}");
        }
    }

    #[test]
    fn tojson_is_pythons_json_dumps() {
        check("{{ messages[1]|tojson }}", r#"{"role": "user", "content": "hi <there> & 'you'"}"#);
        check(
            "{{ {'b': [1, 2.0, none, true], 'a': 'é'}|tojson(sort_keys=true) }}",
            r#"{"a": "é", "b": [1, 2.0, null, true]}"#,
        );
        check("{{ {'a': [1]}|tojson(indent=2) }}", "{\n  \"a\": [\n    1\n  ]\n}");
        check("{{ []|tojson }}{{ {}|tojson }}", "[]{}");
    }

    #[test]
    fn absent_tools_are_none_and_dates_format_like_python() {
        check("{% if tools is not none %}tools{% endif %}{% if documents is none %}none{% endif %}", "none");
        // 2024-07-26 13:05:09 UTC was a Friday; 2000-02-29 a Tuesday.
        let t = 1_721_999_109;
        assert_eq!(
            strftime("%d %b %Y|%-d %B %y|%a %A|%H:%M:%S|%m%%", t).expect("formats"),
            "26 Jul 2024|26 July 24|Fri Friday|13:05:09|07%"
        );
        assert_eq!(strftime("%Y-%m-%d %a", 951_782_400).expect("formats"), "2000-02-29 Tue");
        assert!(strftime("%Q", t).is_err());
        let year = render("{{ strftime_now('%Y') }}", &[]).expect("renders");
        assert!(year.len() == 4 && year.starts_with('2'), "{year}");
    }

    #[test]
    fn a_tag_whose_opening_and_closing_overlap_is_no_tag() {
        // Found by the chat_template fuzz target: `{%}` once panicked while generation tags were stripped.
        assert_eq!(strip_generation_tags("{%}"), "{%}");
        assert_eq!(strip_generation_tags("{%}{% generation %}c{% endgeneration %}"), "{%}{% generation %}c");
        assert!(ChatTemplate::from_source("{%}", &serde_json::json!({})).is_err());
    }

    #[test]
    fn raise_exception_fails_the_render() {
        let err = render("{{ raise_exception('only user turns') }}", &[]).expect_err("raises");
        assert!(err.to_string().contains("only user turns"), "{err}");
    }

    #[test]
    fn template_comes_from_the_config_when_no_jinja_file() {
        let named = serde_json::json!({"chat_template": [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]});
        assert_eq!(config_template(&named).as_deref(), Some("d"));
        assert_eq!(config_template(&serde_json::json!({"chat_template": "x"})).as_deref(), Some("x"));
        assert_eq!(config_template(&serde_json::json!({})), None);
    }

    /// transformers' order: `chat_template.jinja`, the processor's `chat_template.json`, the
    /// tokenizer config's `chat_template`.
    #[test]
    fn the_template_is_found_where_transformers_looks_in_its_order() {
        let dir = tempfile::tempdir().expect("temp dir");
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).expect("write");
        let rendered = || ChatTemplate::load(dir.path()).expect("loads").render(&[], false).expect("renders");
        write("tokenizer_config.json", r#"{"chat_template": "from the tokenizer config"}"#);
        assert_eq!(rendered(), "from the tokenizer config");
        write("chat_template.json", r#"{"chat_template": "from chat_template.json"}"#);
        assert_eq!(rendered(), "from chat_template.json");
        write("chat_template.jinja", "from the jinja file");
        assert_eq!(rendered(), "from the jinja file");
    }
}
