//! What every family's config reading shares: the image processor's settings as transformers
//! saves them, nested under `image_processor` in `processor_config.json` (transformers 5) or
//! flat in `preprocessor_config.json`.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// The processor settings of `json` as the family's serde mirror `T`: the `image_processor`
/// object when there is one, else the whole object; an empty text is an empty object (the
/// processor's defaults). A field of the wrong type is an error, never a default.
pub fn processor_section<T: DeserializeOwned>(json: &str) -> Result<T, serde_json::Error> {
    let mut root: Value =
        if json.trim().is_empty() { Value::Object(Default::default()) } else { serde_json::from_str(json)? };
    let section = match root.get_mut("image_processor") {
        Some(nested) => nested.take(),
        None => root,
    };
    serde_json::from_value(section)
}

/// Which checkpoint a `config.json` describes (flatten this into a family's mirror): its
/// model type, architectures and the dtype its weights are stored in (`dtype`, or the Hub's
/// older `torch_dtype`).
#[derive(serde::Deserialize, Debug, Default)]
pub struct Identity {
    #[serde(default)]
    pub model_type: String,
    #[serde(default)]
    pub architectures: Vec<String>,
    dtype: Option<String>,
    torch_dtype: Option<String>,
}

impl Identity {
    /// The first architecture, or empty.
    pub fn architecture(&self) -> String {
        self.architectures.first().cloned().unwrap_or_default()
    }

    /// The dtype the config says the weights are stored in; f32 when it names none (what
    /// transformers then loads). Two spellings that disagree, or a dtype the encoders do not
    /// read, are errors: the encoder graph declares its weights in this dtype and the
    /// checkpoint is held to it, tensor by tensor, before anything is compiled.
    pub fn weight_dtype(&self) -> Result<WeightDtype, String> {
        let name = match (self.dtype.as_deref(), self.torch_dtype.as_deref()) {
            (Some(a), Some(b)) if a != b => {
                return Err(format!("config.json: dtype `{a}` and torch_dtype `{b}` disagree"));
            }
            (Some(name), _) | (None, Some(name)) => name,
            (None, None) => return Ok(WeightDtype::F32),
        };
        match name {
            "float32" => Ok(WeightDtype::F32),
            "bfloat16" => Ok(WeightDtype::BF16),
            "float16" => Ok(WeightDtype::F16),
            other => {
                Err(format!("config.json: weights stored as `{other}` are not served (float32, bfloat16 or float16)"))
            }
        }
    }
}

/// The dtype a checkpoint stores its weights in. Encoders compute in f32 either way: bf16 and
/// f16 weights stay so in memory and are widened inside the graph, as transformers widens them
/// when it loads such a checkpoint in f32.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightDtype {
    #[default]
    F32,
    BF16,
    F16,
}

impl WeightDtype {
    /// The element type the encoder graph declares the weights in.
    pub fn elem(self) -> mlxcel_emit::Elem {
        match self {
            WeightDtype::F32 => mlxcel_emit::Elem::F32,
            WeightDtype::BF16 => mlxcel_emit::Elem::BF16,
            WeightDtype::F16 => mlxcel_emit::Elem::F16,
        }
    }

    /// The dtype of the graph's parameter declarations and the checkpoint check.
    pub fn dtype(self) -> mlxcel_plugin_api::DType {
        match self {
            WeightDtype::F32 => mlxcel_plugin_api::DType::F32,
            WeightDtype::BF16 => mlxcel_plugin_api::DType::BF16,
            WeightDtype::F16 => mlxcel_plugin_api::DType::F16,
        }
    }
}

/// The processor steps every family shares, as transformers' `BaseImageProcessor` reads
/// them (flatten this into a family's mirror); each absent flag is on.
#[derive(serde::Deserialize, Debug, Default)]
pub struct Steps {
    pub do_resize: Option<bool>,
    pub do_rescale: Option<bool>,
    pub rescale_factor: Option<f64>,
    pub do_normalize: Option<bool>,
    pub image_mean: Option<PerChannel>,
    pub image_std: Option<PerChannel>,
}

/// A mean or std: one number for every channel, or one per channel.
#[derive(serde::Deserialize, Debug, Clone, Copy)]
#[serde(untagged)]
pub enum PerChannel {
    All(f64),
    Each([f64; 3]),
}

impl PerChannel {
    /// Per channel, rounded to f32 as numpy rounds the Python floats when normalising.
    pub fn f32s(self) -> [f32; 3] {
        match self {
            PerChannel::All(x) => [x as f32; 3],
            PerChannel::Each(xs) => xs.map(|x| x as f32),
        }
    }
}

impl Steps {
    pub fn resize(&self) -> bool {
        self.do_resize.unwrap_or(true)
    }

    /// The rescale factor when rescaling (1/255 unless given).
    pub fn rescale(&self) -> Option<f64> {
        self.do_rescale.unwrap_or(true).then_some(self.rescale_factor.unwrap_or(1.0 / 255.0))
    }

    /// Mean and std when normalising, the processor's own defaults for absent ones.
    pub fn normalize(&self, mean: [f64; 3], std: [f64; 3]) -> Option<([f32; 3], [f32; 3])> {
        let pick = |given: Option<PerChannel>, default: [f64; 3]| given.unwrap_or(PerChannel::Each(default)).f32s();
        self.do_normalize.unwrap_or(true).then(|| (pick(self.image_mean, mean), pick(self.image_std, std)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Mirror {
        resample: Option<u32>,
    }

    #[test]
    fn nested_flat_and_empty_processor_configs_read_alike() {
        let read = |json: &str| processor_section::<Mirror>(json).expect("reads");
        assert_eq!(read(r#"{"image_processor": {"resample": 2}, "processor_class": "X"}"#).resample, Some(2));
        assert_eq!(read(r#"{"resample": 3}"#).resample, Some(3));
        assert_eq!(read("  ").resample, None);
        let err = processor_section::<Mirror>(r#"{"resample": "bicubic"}"#).expect_err("a string is no code");
        assert!(err.to_string().contains("invalid type"), "{err}");
    }

    #[test]
    fn the_weight_dtype_is_read_in_either_spelling_and_refused_when_unknown_or_ambiguous() {
        let read = |json: &str| serde_json::from_str::<Identity>(json).expect("reads").weight_dtype();
        assert_eq!(read("{}"), Ok(WeightDtype::F32));
        assert_eq!(read(r#"{"dtype": "bfloat16"}"#), Ok(WeightDtype::BF16));
        assert_eq!(read(r#"{"torch_dtype": "bfloat16"}"#), Ok(WeightDtype::BF16));
        assert_eq!(read(r#"{"dtype": "float32", "torch_dtype": "float32"}"#), Ok(WeightDtype::F32));
        let both = read(r#"{"dtype": "float32", "torch_dtype": "bfloat16"}"#).expect_err("two dtypes");
        assert!(both.contains("disagree"), "{both}");
        assert_eq!(read(r#"{"torch_dtype": "float16"}"#), Ok(WeightDtype::F16));
        let f64 = read(r#"{"torch_dtype": "float64"}"#).expect_err("not served");
        assert!(f64.contains("`float64`"), "{f64}");
    }

    #[test]
    fn steps_default_on_and_take_one_or_three_numbers() {
        let steps = |json: &str| processor_section::<Steps>(json).expect("reads");
        let s = steps("");
        assert!(s.resize());
        assert_eq!(s.rescale(), Some(1.0 / 255.0));
        assert_eq!(s.normalize([0.1; 3], [0.2; 3]), Some(([0.1; 3], [0.2; 3])));
        let s = steps(r#"{"image_mean": 0.5, "image_std": [0.25, 0.5, 1.0], "do_rescale": false}"#);
        assert_eq!((s.rescale(), s.normalize([0.0; 3], [1.0; 3])), (None, Some(([0.5; 3], [0.25, 0.5, 1.0]))));
        assert!(processor_section::<Steps>(r#"{"image_mean": [0.5, 0.5]}"#).is_err(), "two numbers for three channels");
    }
}
