//! Reading a WeNet-style YAML file: typed look-ups that name the key on
//! error and collect warnings for keys nobody read, and
//! `--override_config "a.b.c value"`.

use crate::error::{Error, Result};
use serde_yaml_ng::{Mapping, Value};
use std::path::Path;

/// Parses a YAML file into a value.
pub fn load_yaml(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
    serde_yaml_ng::from_str(&text).map_err(|e| Error::config(path.display().to_string(), format!("not valid YAML: {e}")))
}

/// A short description of a YAML value for messages (`string "abc"`).
pub fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("bool {b}"),
        Value::Number(n) if n.is_f64() => format!("float {n}"),
        Value::Number(n) => format!("integer {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Sequence(_) => "a list".into(),
        Value::Mapping(_) => "a mapping".into(),
        Value::Tagged(t) => format!("tagged value {}", t.tag),
    }
}

/// Sets the nested key `a.b.c` of `root` to `value` (`"a.b.c value"`), as
/// WeNet's `--override_config`. The key must exist, and the new value is
/// converted to the old value's type (an integer may become a float); any
/// other mismatch is an error naming the key.
pub fn apply_override(root: &mut Value, spec: &str) -> Result<()> {
    let parts: Vec<&str> = spec.split_whitespace().collect();
    let [path, raw] = parts[..] else {
        return Err(Error::config(spec, "expected an override of the form \"a.b.c value\""));
    };
    let mut node = root;
    let keys: Vec<&str> = path.split('.').collect();
    for (i, k) in keys.iter().enumerate() {
        let here = keys[..=i].join(".");
        let map = node.as_mapping_mut().ok_or_else(|| Error::config(keys[..i].join("."), "cannot override a key inside a value that is not a mapping"))?;
        node = map.get_mut(*k).ok_or_else(|| Error::config(here.clone(), "no such key in the config"))?;
    }
    let parsed: Value = serde_yaml_ng::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()));
    let new = match (&*node, &parsed) {
        (Value::Bool(_), _) => match raw {
            "true" | "True" => Value::Bool(true),
            "false" | "False" => Value::Bool(false),
            _ => return Err(Error::config(path, format!("expected a bool (true/false), got {raw:?}"))),
        },
        (Value::Number(o), Value::Number(n)) if o.is_f64() => Value::from(n.as_f64().unwrap_or(f64::NAN)),
        (Value::Number(o), Value::Number(n)) if !o.is_f64() && !n.is_f64() => parsed.clone(),
        (Value::String(_), _) => Value::String(raw.to_string()),
        (Value::Null, _) => parsed.clone(),
        (old, _) => return Err(Error::config(path, format!("cannot replace {} with {}", describe(old), describe(&parsed)))),
    };
    *node = new;
    Ok(())
}

/// One mapping of the config, read key by key.
pub struct Section<'a> {
    path: String,
    map: Option<&'a Mapping>,
    used: Vec<String>,
}

impl<'a> Section<'a> {
    /// The mapping under `key` of `root` (an absent or null key reads as empty).
    pub fn of(root: &'a Value, key: &str) -> Result<Self> {
        let map = match root.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::Mapping(m)) => Some(m),
            Some(other) => return Err(Error::config(key, format!("expected a mapping, found {}", describe(other)))),
        };
        Ok(Section { path: key.to_string(), map, used: Vec::new() })
    }

    /// The whole document as a section (its path is empty).
    pub fn root(root: &'a Value) -> Result<Self> {
        match root {
            Value::Mapping(m) => Ok(Section { path: String::new(), map: Some(m), used: Vec::new() }),
            Value::Null => Ok(Section { path: String::new(), map: None, used: Vec::new() }),
            other => Err(Error::config("<root>", format!("expected a mapping, found {}", describe(other)))),
        }
    }

    /// The dotted name of `key` in this section.
    pub fn key(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// The raw value of `key`, marking it read.
    pub fn raw(&mut self, key: &str) -> Option<&'a Value> {
        self.used.push(key.to_string());
        self.map.and_then(|m| m.get(key)).filter(|v| !v.is_null())
    }

    /// A non-negative integer.
    pub fn usize_or(&mut self, key: &str, default: usize) -> Result<usize> {
        match self.raw(key) {
            None => Ok(default),
            Some(v) => {
                v.as_u64().map(|n| n as usize).ok_or_else(|| Error::config(self.key(key), format!("expected a non-negative integer, found {}", describe(v))))
            }
        }
    }

    /// A required non-negative integer.
    pub fn usize_req(&mut self, key: &str) -> Result<usize> {
        match self.raw(key) {
            None => Err(Error::config(self.key(key), "missing (expected a non-negative integer)")),
            Some(v) => {
                v.as_u64().map(|n| n as usize).ok_or_else(|| Error::config(self.key(key), format!("expected a non-negative integer, found {}", describe(v))))
            }
        }
    }

    /// An integer (possibly negative).
    pub fn i64_or(&mut self, key: &str, default: i64) -> Result<i64> {
        match self.raw(key) {
            None => Ok(default),
            Some(v) => v.as_i64().ok_or_else(|| Error::config(self.key(key), format!("expected an integer, found {}", describe(v)))),
        }
    }

    /// A number (an integer is accepted).
    pub fn f64_or(&mut self, key: &str, default: f64) -> Result<f64> {
        match self.raw(key) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| Error::config(self.key(key), format!("expected a number, found {}", describe(v)))),
        }
    }

    /// A probability in [0, 1].
    pub fn rate_or(&mut self, key: &str, default: f64) -> Result<f64> {
        let r = self.f64_or(key, default)?;
        if !(0.0..=1.0).contains(&r) {
            return Err(Error::config(self.key(key), format!("expected a value in [0, 1], found {r}")));
        }
        Ok(r)
    }

    /// A bool.
    pub fn bool_or(&mut self, key: &str, default: bool) -> Result<bool> {
        match self.raw(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| Error::config(self.key(key), format!("expected a bool, found {}", describe(v)))),
        }
    }

    /// A string.
    pub fn str_or(&mut self, key: &str, default: &str) -> Result<String> {
        match self.raw(key) {
            None => Ok(default.to_string()),
            Some(v) => v.as_str().map(str::to_string).ok_or_else(|| Error::config(self.key(key), format!("expected a string, found {}", describe(v)))),
        }
    }

    /// Accepts a WeNet option only at the value this build implements.
    pub fn only(&mut self, key: &str, supported: &Value) -> Result<()> {
        if let Some(v) = self.raw(key) {
            let same = match (v, supported) {
                (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
                _ => v == supported,
            };
            if !same {
                return Err(Error::config(self.key(key), format!("only {} is supported, found {}", describe(supported), describe(v))));
            }
        }
        Ok(())
    }

    /// Warns (into `warnings`) about a key that is read but has no effect here when set.
    pub fn ignored(&mut self, key: &str, warnings: &mut Vec<String>, why: &str) {
        if let Some(v) = self.raw(key) {
            let off = matches!(v, Value::Bool(false)) || v.as_f64() == Some(0.0);
            if !off {
                warnings.push(format!("config key `{}` ({}) is ignored: {why}", self.key(key), describe(v)));
            }
        }
    }

    /// Warns about every key that was never read, except `silent` ones.
    pub fn finish(self, silent: &[&str], warnings: &mut Vec<String>) {
        let Some(m) = self.map else { return };
        for k in m.keys() {
            let name = k.as_str().map(str::to_string).unwrap_or_else(|| describe(k));
            if !self.used.contains(&name) && !silent.contains(&name.as_str()) {
                warnings.push(format!("unknown config key `{}` is ignored", self.key(&name)));
            }
        }
    }
}
