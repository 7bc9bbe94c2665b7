//! Tool calls: a request's `tools` and `tool_choice` checked, the grammar that forces calls
//! (`required` or a named function), and the model's calls read back out of its text into the
//! chat API's `tool_calls`, whole or as they stream.
//!
//! The syntax is the family's, declared in its manifest (`[chat] tool_call_format`), never
//! guessed from the text. `hermes` is the one the host parses: each call a JSON object
//! `{"name": ..., "arguments": {...}}` on its own lines between `<tool_call>` and
//! `</tool_call>`, as the chat templates of that family render past calls.

use mlxcel_host::grammar::Grammar;
use serde_json::{Value, json};

use super::api::{ApiError, FunctionCall, ToolCallBody};

/// The most tools one request may define.
const MAX_TOOLS: usize = 128;
const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// Whether and how the model may call tools.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ToolChoice {
    /// No call: the answer is text (the tools are still rendered, as context).
    None,
    /// The model decides; calls it writes are returned as calls.
    Auto,
    /// At least one call, enforced.
    Required,
    /// A call of this function, enforced.
    Named(String),
}

/// A request's tools, checked.
#[derive(Debug)]
pub(crate) struct Tools {
    /// The definitions as sent, for the template's `tools`.
    pub(crate) definitions: Vec<Value>,
    pub(crate) choice: ToolChoice,
    /// More than one call per answer may be made.
    parallel: bool,
    /// Each function's name and its arguments' schema.
    functions: Vec<(String, Value)>,
}

fn invalid(param: &'static str, message: String) -> ApiError {
    ApiError::invalid("invalid_value", message).param(param)
}

impl Tools {
    /// The request's tools, or `None` when it defines none. `format` is the family's declared
    /// call syntax and `rendered` whether the chat template reads `tools`: calls that could be
    /// neither rendered nor parsed are refused, never dropped.
    pub(crate) fn from_request(
        tools: Option<&[Value]>,
        choice: Option<&Value>,
        parallel: Option<bool>,
        format: Option<&str>,
        rendered: bool,
    ) -> Result<Option<Self>, ApiError> {
        let choice =
            match choice {
                None => None,
                Some(Value::String(s)) if s == "none" => Some(ToolChoice::None),
                Some(Value::String(s)) if s == "auto" => Some(ToolChoice::Auto),
                Some(Value::String(s)) if s == "required" => Some(ToolChoice::Required),
                Some(Value::Object(o)) if o.get("type") == Some(&json!("function")) => {
                    match o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
                        Some(name) if o.len() == 2 => Some(ToolChoice::Named(name.to_owned())),
                        _ => return Err(invalid(
                            "tool_choice",
                            "tool_choice names a function as {\"type\": \"function\", \"function\": {\"name\": ...}}"
                                .to_owned(),
                        )),
                    }
                }
                Some(other) => {
                    return Err(invalid(
                        "tool_choice",
                        format!("tool_choice must be none, auto, required or a named function, not {other}"),
                    ));
                }
            };
        let tools = match tools {
            None | Some([]) => {
                return match choice {
                    None | Some(ToolChoice::None) => Ok(None),
                    Some(_) => Err(invalid("tool_choice", "tool_choice other than none needs tools".to_owned())),
                };
            }
            Some(tools) => tools,
        };
        if tools.len() > MAX_TOOLS {
            return Err(invalid("tools", format!("{} tools; at most {MAX_TOOLS}", tools.len())));
        }
        let mut functions: Vec<(String, Value)> = Vec::with_capacity(tools.len());
        for (i, tool) in tools.iter().enumerate() {
            let function = match tool.as_object() {
                Some(o) if o.get("type") == Some(&json!("function")) && o.len() == 2 => o.get("function"),
                _ => None,
            };
            let Some(function) = function.and_then(Value::as_object) else {
                return Err(invalid(
                    "tools",
                    format!("tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}"),
                ));
            };
            if let Some(key) =
                function.keys().find(|k| !["name", "description", "parameters", "strict"].contains(&k.as_str()))
            {
                return Err(invalid("tools", format!("tools[{i}].function.{key} is not a field of a function")));
            }
            let name = function.get("name").and_then(Value::as_str).unwrap_or_default();
            let name_ok = (1..=64).contains(&name.len())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !name_ok {
                return Err(invalid(
                    "tools",
                    format!("tools[{i}].function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -"),
                ));
            }
            if functions.iter().any(|(n, _)| n == name) {
                return Err(invalid("tools", format!("tools define `{name}` twice")));
            }
            let parameters = match function.get("parameters") {
                None => json!({"type": "object", "properties": {}}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => {
                    return Err(invalid(
                        "tools",
                        format!("tools[{i}].function.parameters must be a JSON schema object"),
                    ));
                }
            };
            functions.push((name.to_owned(), parameters));
        }
        let choice = choice.unwrap_or(ToolChoice::Auto);
        if let ToolChoice::Named(name) = &choice
            && !functions.iter().any(|(n, _)| n == name)
        {
            return Err(invalid("tool_choice", format!("tool_choice names `{name}`, which tools do not define")));
        }
        if choice != ToolChoice::None {
            if format.is_none() {
                return Err(ApiError::invalid(
                    "unsupported_value",
                    "this model's family declares no tool-call syntax, so calls could not be read back (send tool_choice: none to only show the tools)",
                )
                .param("tools"));
            }
            if !rendered {
                return Err(ApiError::invalid(
                    "unsupported_value",
                    "this checkpoint's chat template does not render tools, so the model would never see them",
                )
                .param("tools"));
            }
        }
        Ok(Some(Tools { definitions: tools.to_vec(), choice, parallel: parallel.unwrap_or(true), functions }))
    }

    /// The grammar of the answer when calls are forced: one call (or, with parallel calls,
    /// one or more), each of a defined function (or the named one) with arguments of its
    /// schema. `None` when the model decides.
    pub(crate) fn grammar(&self) -> Option<Grammar> {
        let names: Vec<&(String, Value)> = match &self.choice {
            ToolChoice::None | ToolChoice::Auto => return None,
            ToolChoice::Required => self.functions.iter().collect(),
            ToolChoice::Named(name) => self.functions.iter().filter(|(n, _)| n == name).collect(),
        };
        let mut lark = String::from(if self.parallel { "start: call (\"\\n\" call)*\n" } else { "start: call\n" });
        let alternatives: Vec<String> = (0..names.len()).map(|i| format!("f{i}")).collect();
        lark.push_str(&format!("call: \"{OPEN}\\n\" ({}) \"\\n{CLOSE}\"\n", alternatives.join(" | ")));
        for (i, (name, parameters)) in names.iter().enumerate() {
            let schema = json!({
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            });
            lark.push_str(&format!("f{i}: %json {}\n", Grammar::laid_out(&schema)));
        }
        Some(Grammar::Lark(lark))
    }

    /// Reads calls out of the answer, unless the model may not call.
    pub(crate) fn scanner(&self) -> Option<CallScanner> {
        (self.choice != ToolChoice::None).then(|| CallScanner {
            names: self.functions.iter().map(|(n, _)| n.clone()).collect(),
            pending: String::new(),
            inside: false,
            limit: (!self.parallel).then_some(1),
            taken: 0,
        })
    }
}

/// What a piece of the answer holds: text, and calls completed in it.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Scanned {
    pub(crate) content: String,
    pub(crate) calls: Vec<ToolCallBody>,
}

/// Reads `hermes` calls out of text as it streams: text outside calls is content (held back
/// while it may be the start of `<tool_call>`), a call is returned once its closing line
/// arrives. A call whose body is not a call of a defined function stays text, as written.
#[derive(Debug)]
pub(crate) struct CallScanner {
    names: Vec<String>,
    /// Text not yet given out: a possible start of `<tool_call>`, or a call's body so far.
    pending: String,
    /// `pending` is inside a call (after its `<tool_call>`).
    inside: bool,
    /// Calls an answer may make (one without parallel calls): the answer ends after the last.
    limit: Option<usize>,
    /// Calls read so far.
    taken: usize,
}

impl CallScanner {
    /// The answer has made every call it may: nothing after it counts, and it ends.
    pub(crate) fn is_full(&self) -> bool {
        self.limit.is_some_and(|limit| self.taken >= limit)
    }

    pub(crate) fn push(&mut self, text: &str) -> Scanned {
        let mut out = Scanned::default();
        if self.is_full() {
            return out;
        }
        self.pending.push_str(text);
        loop {
            if self.is_full() {
                self.pending.clear();
                break;
            }
            if self.inside {
                let Some(end) = self.pending.find(CLOSE) else { break };
                let body: String = self.pending.drain(..end + CLOSE.len()).collect();
                self.inside = false;
                self.take_call(&body[..end], &mut out);
            } else if let Some(start) = self.pending.find(OPEN) {
                out.content.extend(self.pending.drain(..start));
                self.pending.drain(..OPEN.len());
                self.inside = true;
            } else {
                // Keep back the longest end of the text that could begin `<tool_call>`.
                let keep = (1..OPEN.len().min(self.pending.len() + 1))
                    .rev()
                    .find(|&n| {
                        self.pending.is_char_boundary(self.pending.len() - n)
                            && OPEN.starts_with(&self.pending[self.pending.len() - n..])
                    })
                    .unwrap_or(0);
                out.content.extend(self.pending.drain(..self.pending.len() - keep));
                break;
            }
        }
        out
    }

    /// The end of the answer: a call cut short of its closing line (by a stop string or the
    /// token limit) counts if its body is already a whole call; anything else left is text.
    pub(crate) fn finish(&mut self) -> Scanned {
        let mut out = Scanned::default();
        let rest = std::mem::take(&mut self.pending);
        if self.is_full() {
            return out;
        }
        if self.inside {
            self.inside = false;
            self.take_call(&rest, &mut out);
        } else {
            out.content = rest;
        }
        out
    }

    fn take_call(&mut self, body: &str, out: &mut Scanned) {
        match self.parse(body) {
            Some((name, arguments)) => {
                self.taken += 1;
                out.calls.push(ToolCallBody {
                    id: format!("call_{}", super::http::uuid_like()),
                    kind: "function".to_owned(),
                    function: FunctionCall { name, arguments },
                });
            }
            None => {
                out.content.push_str(OPEN);
                out.content.push_str(body);
            }
        }
    }

    /// `{"name": ..., "arguments": {...}}` of a defined function: its name and arguments' text.
    fn parse(&self, body: &str) -> Option<(String, String)> {
        let call: serde_json::Map<String, Value> = serde_json::from_str(body.trim()).ok()?;
        let name = call.get("name")?.as_str()?;
        if call.len() != 2 || !self.names.iter().any(|n| n == name) {
            return None;
        }
        let arguments = call.get("arguments")?;
        arguments.is_object().then(|| (name.to_owned(), arguments.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Vec<Value> {
        vec![json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})]
    }

    fn tools(choice: Value) -> Tools {
        Tools::from_request(Some(&weather()), Some(&choice), None, Some("hermes"), true).expect("valid").expect("tools")
    }

    #[test]
    fn calls_are_read_whole_or_split_anywhere_and_text_around_them_stays_text() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        for split in [1, 2, 3, 5, 11, text.len()] {
            let mut scanner = tools(json!("auto")).scanner().expect("scanner");
            let mut all = Scanned::default();
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(split) {
                let got = scanner.push(&piece.iter().collect::<String>());
                all.content.push_str(&got.content);
                all.calls.extend(got.calls);
            }
            let rest = scanner.finish();
            all.content.push_str(&rest.content);
            assert_eq!(all.content, "Let me look.\n\n", "split {split}");
            let args: Vec<&str> = all.calls.iter().map(|c| c.function.arguments.as_str()).collect();
            assert_eq!(args, ["{\"city\":\"Paris\"}", "{\"city\":\"Oslo\"}"], "split {split}");
            assert!(all.calls.iter().all(|c| c.function.name == "get_weather" && c.id.starts_with("call_")));
        }
    }

    #[test]
    fn without_parallel_calls_the_answer_ends_after_its_first_call() {
        let tools = Tools::from_request(Some(&weather()), None, Some(false), Some("hermes"), true)
            .expect("valid")
            .expect("tools");
        let mut scanner = tools.scanner().expect("scanner");
        let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
        let got = scanner.push(&format!("{call}\n{call} and more"));
        assert_eq!((got.calls.len(), got.content.as_str(), scanner.is_full()), (1, "", true));
        assert_eq!(scanner.push(call), Scanned::default());
        assert_eq!(scanner.finish(), Scanned::default());
    }

    #[test]
    fn what_is_not_a_call_of_a_defined_function_stays_text() {
        for body in
            ["{\"name\": \"other\", \"arguments\": {}}", "not json", "{\"name\": \"get_weather\", \"arguments\": 3}"]
        {
            let mut scanner = tools(json!("auto")).scanner().expect("scanner");
            let text = format!("<tool_call>{body}</tool_call> and <tool_");
            let mut got = scanner.push(&text);
            let rest = scanner.finish();
            got.content.push_str(&rest.content);
            assert_eq!(got.content, format!("<tool_call>{body} and <tool_"));
            assert!(got.calls.is_empty());
        }
        // Cut before its closing line, a whole call still counts.
        let mut scanner = tools(json!("auto")).scanner().expect("scanner");
        scanner.push("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n");
        assert_eq!(scanner.finish().calls.len(), 1);
    }

    /// Random tokens under the forced-call grammar always spell calls the scanner reads back,
    /// with arguments of the function's schema.
    #[test]
    fn forced_calls_follow_the_grammar_and_read_back_as_calls() {
        use mlxcel_host::grammar::Vocabulary;
        use mlxcel_host::text::Tokenizer;
        use rand_chacha::ChaCha8Rng;
        use rand_chacha::rand_core::{RngCore, SeedableRng};

        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen2_5_vl");
        let tokenizer = Tokenizer::load(&dir).expect("tokenizer");
        let vocabulary = Vocabulary::new(&tokenizer, 384).expect("vocabulary");
        let mut defs = weather();
        defs.push(json!({"type": "function", "function": {"name": "pick", "parameters": {"type": "object",
            "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["n"], "additionalProperties": false}}}));
        for (choice, parallel) in [
            (json!("required"), false),
            (json!("required"), true),
            (json!({"type": "function", "function": {"name": "pick"}}), true),
        ] {
            let tools = Tools::from_request(Some(&defs), Some(&choice), Some(parallel), Some("hermes"), true)
                .expect("valid")
                .expect("tools");
            let grammar = tools.grammar().expect("forced");
            for seed in 0..4 {
                let mut constraint = vocabulary.constrain(&grammar, vec![386]).expect("compiles");
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let mut ids = Vec::new();
                loop {
                    // `}` and `"` favoured so random strings end in a few tokens.
                    let mut logits: Vec<f32> = (0..448).map(|_| (rng.next_u32() % 1000) as f32 / 100.0).collect();
                    logits[92] += 6.0;
                    logits[1] += 4.0;
                    constraint.restrict(&mut logits).expect("restrict");
                    let token = mlxcel_host::sampling::greedy(&logits).expect("token");
                    constraint.accept(token).expect("accept");
                    if token == 386 {
                        break;
                    }
                    ids.push(token);
                    assert!(ids.len() < 600, "{:?}", tokenizer.decode(&ids, false));
                }
                let text = tokenizer.decode(&ids, false).expect("decode");
                let mut scanner = tools.scanner().expect("scanner");
                let mut read = scanner.push(&text);
                let rest = scanner.finish();
                read.content.push_str(&rest.content);
                read.calls.extend(rest.calls);
                assert!(read.content.trim().is_empty(), "{text:?}");
                assert!(!read.calls.is_empty() && (parallel || read.calls.len() == 1), "{text:?}");
                for call in &read.calls {
                    let args: Value = serde_json::from_str(&call.function.arguments).expect("json");
                    match call.function.name.as_str() {
                        "pick" => assert!(args["n"].as_i64().is_some_and(|n| (1..=3).contains(&n)), "{text}"),
                        "get_weather" => assert!(args["city"].is_string(), "{text}"),
                        other => panic!("{other}"),
                    }
                    if choice.is_object() {
                        assert_eq!(call.function.name, "pick");
                    }
                }
                assert!(text.starts_with("<tool_call>\n{\"name\": \""), "{text}");
            }
        }
    }

    #[test]
    fn choices_and_definitions_are_checked() {
        let bad = |tools: Option<Vec<Value>>, choice: Option<Value>, format: Option<&str>, rendered: bool| {
            Tools::from_request(tools.as_deref(), choice.as_ref(), None, format, rendered).err().map(|e| e.message)
        };
        assert!(bad(None, Some(json!("required")), Some("hermes"), true).is_some());
        assert!(bad(None, Some(json!("none")), None, false).is_none());
        assert!(bad(Some(weather()), Some(json!("sometimes")), Some("hermes"), true).is_some());
        let named = json!({"type": "function", "function": {"name": "nope"}});
        assert!(bad(Some(weather()), Some(named), Some("hermes"), true).unwrap_or_default().contains("nope"));
        assert!(bad(Some(weather()), None, None, true).unwrap_or_default().contains("tool-call syntax"));
        assert!(bad(Some(weather()), None, Some("hermes"), false).unwrap_or_default().contains("does not render"));
        // `none` shows the tools without either.
        assert!(bad(Some(weather()), Some(json!("none")), None, false).is_none());
        let twice = [weather(), weather()].concat();
        assert!(bad(Some(twice), None, Some("hermes"), true).unwrap_or_default().contains("twice"));
        let odd = vec![json!({"type": "function", "function": {"name": "a b"}})];
        assert!(bad(Some(odd), None, Some("hermes"), true).is_some());
        let extra = vec![json!({"type": "function", "function": {"name": "f", "returns": {}}})];
        assert!(bad(Some(extra), None, Some("hermes"), true).unwrap_or_default().contains("returns"));
        assert_eq!(tools(json!("auto")).grammar(), None);
        assert!(matches!(tools(json!("required")).grammar(), Some(Grammar::Lark(_))));
    }
}
