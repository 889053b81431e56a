//! The DeepSpeed JSON file as serde section structs: one
//! `#[derive(Deserialize)]` struct per section, whose fields are the keys
//! asrforge reads or accepts. Each field's type says what the key may hold
//! and words the error when it holds something else ("expected a number or
//! \"auto\", found a list"); `serde_path_to_error` supplies the key path the
//! error names, and `serde_ignored` the paths of the keys no struct knows
//! (warned about, as DeepSpeed ignores them too). Absent and `null` keys
//! are `None`; the defaults and the checks between keys stay with
//! `deepspeed::parse_deepspeed_config`.

use super::deepspeed::Setting;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use std::fmt;
use std::marker::PhantomData;

/// How an error names a JSON value that has the wrong type.
pub(crate) fn kind_of(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// A key's value read from any JSON value, or the message of why not.
trait FromJson: Sized {
    fn from_json(v: &Value) -> Result<Self, String>;
}

/// Deserializes a key's value through its [`FromJson`], so the message is
/// ours and the path is the one `serde_path_to_error` tracks.
macro_rules! json_field {
    ($($t:ident),*) => {$(
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let v = Value::deserialize(d)?;
                <$t as FromJson>::from_json(&v).map_err(de::Error::custom)
            }
        }
    )*};
}

/// `true` or `false`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Flag(pub Option<bool>);

/// A number.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Num(pub Option<f64>);

/// A number or `"auto"`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NumOrAuto(pub Option<Setting<f64>>);

/// A non-negative integer (DeepSpeed's own files write counts as `1e8`: any
/// integral number is one).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Count(pub Option<u64>);

/// A non-negative integer or `"auto"`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CountOrAuto(pub Option<Setting<u64>>);

/// A string.
#[derive(Clone, Debug, Default)]
pub(crate) struct Text(pub Option<String>);

/// Adam's `betas`: a list of two numbers or `"auto"`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Betas(pub Option<Setting<(f64, f64)>>);

/// A key DeepSpeed has and asrforge accepts without reading it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Unused;

json_field!(Flag, Num, NumOrAuto, Count, CountOrAuto, Text, Betas, Unused);

fn number(v: &Value, auto: bool) -> Result<Option<Setting<f64>>, String> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => n.as_f64().map(|x| Some(Setting::Value(x))).ok_or_else(|| format!("expected a number, found {n}")),
        Value::String(s) if auto && s == "auto" => Ok(Some(Setting::Auto)),
        other => Err(format!("expected a number{}, found {}", if auto { " or \"auto\"" } else { "" }, kind_of(other))),
    }
}

fn count(v: &Value, auto: bool) -> Result<Option<Setting<u64>>, String> {
    match number(v, auto)? {
        None => Ok(None),
        Some(Setting::Auto) => Ok(Some(Setting::Auto)),
        Some(Setting::Value(x)) if x >= 0.0 && x.fract() == 0.0 && x < 1.8e19 => Ok(Some(Setting::Value(x as u64))),
        Some(Setting::Value(x)) => Err(format!("expected a non-negative integer, found {x}")),
    }
}

/// The value of a setting that cannot be `"auto"` (never `Auto`: `auto` was false).
fn fixed<T>(s: Option<Setting<T>>) -> Option<T> {
    match s {
        Some(Setting::Value(v)) => Some(v),
        _ => None,
    }
}

impl FromJson for Flag {
    fn from_json(v: &Value) -> Result<Self, String> {
        match v {
            Value::Null => Ok(Flag(None)),
            Value::Bool(b) => Ok(Flag(Some(*b))),
            other => Err(format!("expected true or false, found {}", kind_of(other))),
        }
    }
}

impl FromJson for Num {
    fn from_json(v: &Value) -> Result<Self, String> {
        Ok(Num(fixed(number(v, false)?)))
    }
}

impl FromJson for NumOrAuto {
    fn from_json(v: &Value) -> Result<Self, String> {
        Ok(NumOrAuto(number(v, true)?))
    }
}

impl FromJson for Count {
    fn from_json(v: &Value) -> Result<Self, String> {
        Ok(Count(fixed(count(v, false)?)))
    }
}

impl FromJson for CountOrAuto {
    fn from_json(v: &Value) -> Result<Self, String> {
        Ok(CountOrAuto(count(v, true)?))
    }
}

impl FromJson for Text {
    fn from_json(v: &Value) -> Result<Self, String> {
        match v {
            Value::Null => Ok(Text(None)),
            Value::String(s) => Ok(Text(Some(s.clone()))),
            other => Err(format!("expected a string, found {}", kind_of(other))),
        }
    }
}

impl FromJson for Betas {
    fn from_json(v: &Value) -> Result<Self, String> {
        match v {
            Value::Null => Ok(Betas(None)),
            Value::String(s) if s == "auto" => Ok(Betas(Some(Setting::Auto))),
            Value::Array(a) if a.len() == 2 && a.iter().all(Value::is_number) => {
                Ok(Betas(Some(Setting::Value((a[0].as_f64().unwrap_or(0.9), a[1].as_f64().unwrap_or(0.999))))))
            }
            other => Err(format!("expected a list of two numbers or \"auto\", found {}", kind_of(other))),
        }
    }
}

impl FromJson for Unused {
    fn from_json(_: &Value) -> Result<Self, String> {
        Ok(Unused)
    }
}

/// A section: a JSON object read as `T`, or `None` when absent or `null`.
/// The object is handed to `T` as the map being read (not a copy), so the
/// paths of its keys stay tracked.
#[derive(Clone, Debug)]
pub(crate) struct Section<T>(pub Option<T>);

impl<T> Default for Section<T> {
    fn default() -> Self {
        Section(None)
    }
}

struct SectionVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for SectionVisitor<T> {
    type Value = Section<T>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::deserialize(de::value::MapAccessDeserializer::new(map)).map(|t| Section(Some(t)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Section(None))
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Section(None))
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Self::Value, E> {
        Err(not_object(&Value::Bool(b)))
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
        Err(not_object(&Value::from(n)))
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
        Err(not_object(&Value::from(n)))
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Self::Value, E> {
        Err(not_object(&Value::from(n)))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Err(not_object(&Value::from(s)))
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(not_object(&Value::Array(Vec::new())))
    }
}

fn not_object<E: de::Error>(v: &Value) -> E {
    E::custom(format!("expected an object, found {}", kind_of(v)))
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Section<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SectionVisitor(PhantomData))
    }
}

/// The file's top level.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct TopJson {
    pub train_micro_batch_size_per_gpu: CountOrAuto,
    pub gradient_accumulation_steps: CountOrAuto,
    pub gradient_clipping: NumOrAuto,
    pub steps_per_print: Count,
    pub communication_data_type: Text,
    pub zero_optimization: Section<ZeroJson>,
    pub fp16: Section<Fp16Json>,
    pub bf16: Section<Bf16Json>,
    pub bfloat16: Section<Bf16Json>,
    pub optimizer: Section<OptimizerJson>,
    pub scheduler: Section<SchedulerJson>,
}

/// `zero_optimization`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ZeroJson {
    pub stage: Count,
    pub reduce_bucket_size: CountOrAuto,
    pub allgather_bucket_size: CountOrAuto,
    pub overlap_comm: Flag,
    pub contiguous_gradients: Flag,
    pub reduce_scatter: Flag,
    pub allgather_partitions: Flag,
    pub offload_optimizer: Section<OffloadJson>,
    pub offload_param: Section<OffloadJson>,
    pub round_robin_gradients: Unused,
}

/// `zero_optimization.offload_optimizer` and `.offload_param`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct OffloadJson {
    pub device: Text,
    pub pin_memory: Unused,
    pub nvme_path: Unused,
    pub buffer_count: Unused,
    pub fast_init: Unused,
    pub ratio: Unused,
}

/// `fp16`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Fp16Json {
    pub enabled: Flag,
    pub auto_cast: Flag,
    pub loss_scale: Num,
    pub initial_scale_power: Count,
    pub loss_scale_window: Count,
    pub hysteresis: Count,
    pub consecutive_hysteresis: Flag,
    pub min_loss_scale: Num,
}

/// `bf16` (or its old name `bfloat16`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Bf16Json {
    pub enabled: Flag,
    pub immediate_grad_update: Unused,
    pub check_grad_overflow: Unused,
}

/// `optimizer`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct OptimizerJson {
    #[serde(rename = "type")]
    pub kind: Text,
    pub params: Section<AdamParamsJson>,
}

/// `optimizer.params`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct AdamParamsJson {
    pub lr: NumOrAuto,
    pub betas: Betas,
    pub eps: NumOrAuto,
    pub weight_decay: NumOrAuto,
    pub adam_w_mode: Flag,
    pub torch_adam: Unused,
}

/// `scheduler`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct SchedulerJson {
    #[serde(rename = "type")]
    pub kind: Text,
    pub params: Section<WarmupParamsJson>,
}

/// `scheduler.params` (WarmupLR's).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct WarmupParamsJson {
    pub warmup_min_lr: NumOrAuto,
    pub warmup_max_lr: NumOrAuto,
    pub warmup_num_steps: NumOrAuto,
    pub warmup_type: Text,
    pub last_batch_iteration: Unused,
}

/// Reads `root` (a JSON object) as [`TopJson`]; returns the paths of the
/// keys no section struct has (`zero_optimization.foo`), in reading order,
/// or the path and message of the first key whose value has the wrong type.
pub(crate) fn read_top(root: &Value) -> Result<(TopJson, Vec<String>), (String, String)> {
    let mut unknown = Vec::new();
    let mut note = |path: serde_ignored::Path| unknown.push(path.to_string());
    let ignored = serde_ignored::Deserializer::new(root, &mut note);
    let top = serde_path_to_error::deserialize(ignored).map_err(|e| (e.path().to_string(), e.inner().to_string()))?;
    Ok((top, unknown))
}
