//! The JSON Schema subset docs/api/openapi.yaml uses, enough to check that a
//! response body is what the document says: `type` (a name or a list, with
//! `null`), `required`, `properties`, `additionalProperties` (bool or schema),
//! `items`, `enum`, `const`, `$ref` into the document, `anyOf`/`oneOf`/`allOf`,
//! `minimum`/`maximum`, `minLength`, `minItems`. Other keywords (`format`,
//! `description`, `default`, ...) are annotations and ignored.
use serde_json::Value;

pub struct Validator<'a> {
    doc: &'a Value,
    /// Also reject object keys the schema does not list in `properties`, even
    /// where `additionalProperties` lets clients accept them: the document must
    /// describe every key the server actually sends.
    pub undeclared_keys_are_errors: bool,
}

impl<'a> Validator<'a> {
    pub fn new(doc: &'a Value) -> Self {
        Validator { doc, undeclared_keys_are_errors: false }
    }

    pub fn strict(doc: &'a Value) -> Self {
        Validator { doc, undeclared_keys_are_errors: true }
    }

    /// A local reference (`#/components/schemas/Sandbox`) in the document.
    pub fn resolve(&self, reference: &str) -> Result<&'a Value, String> {
        let pointer =
            reference.strip_prefix('#').ok_or_else(|| format!("only local $refs are supported: {reference}"))?;
        self.doc.pointer(pointer).ok_or_else(|| format!("$ref {reference} does not resolve"))
    }

    /// Every violation, each prefixed with where in `value` it is (`$.items[0].id`).
    pub fn validate(&self, schema: &Value, value: &Value) -> Result<(), Vec<String>> {
        let mut errs = Vec::new();
        self.check(schema, value, "$", &mut errs);
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs)
        }
    }

    fn check(&self, schema: &Value, v: &Value, at: &str, errs: &mut Vec<String>) {
        let s = match schema {
            Value::Bool(true) => return,
            Value::Bool(false) => return errs.push(format!("{at}: no value is allowed here")),
            Value::Object(s) => s,
            other => return errs.push(format!("{at}: the schema is not an object: {other}")),
        };
        if let Some(r) = s.get("$ref").and_then(Value::as_str) {
            match self.resolve(r) {
                Ok(target) => self.check(target, v, at, errs),
                Err(e) => errs.push(format!("{at}: {e}")),
            }
        }
        if let Some(t) = s.get("type") {
            let types: Vec<&str> = match t {
                Value::String(one) => vec![one.as_str()],
                Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            if !types.iter().any(|t| has_type(t, v)) {
                // Nothing below makes sense for a value of the wrong type.
                return errs.push(format!("{at}: expected {}, got {}", types.join(" or "), type_of(v)));
            }
        }
        if let Some(allowed) = s.get("enum").and_then(Value::as_array) {
            if !allowed.contains(v) {
                errs.push(format!("{at}: {v} is not one of {}", Value::Array(allowed.clone())));
            }
        }
        if let Some(c) = s.get("const").filter(|c| *c != v) {
            errs.push(format!("{at}: {v} is not {c}"));
        }
        if let (Some(min), Some(n)) = (s.get("minimum").and_then(Value::as_f64), v.as_f64()) {
            if n < min {
                errs.push(format!("{at}: {n} is below the minimum {min}"));
            }
        }
        if let (Some(max), Some(n)) = (s.get("maximum").and_then(Value::as_f64), v.as_f64()) {
            if n > max {
                errs.push(format!("{at}: {n} is above the maximum {max}"));
            }
        }
        if let (Some(min), Some(text)) = (s.get("minLength").and_then(Value::as_u64), v.as_str()) {
            if (text.chars().count() as u64) < min {
                errs.push(format!("{at}: shorter than {min} characters"));
            }
        }
        if let Value::Object(obj) = v {
            self.check_object(s, obj, at, errs);
        }
        if let Value::Array(items) = v {
            if let Some(min) = s.get("minItems").and_then(Value::as_u64) {
                if (items.len() as u64) < min {
                    errs.push(format!("{at}: fewer than {min} items"));
                }
            }
            if let Some(item_schema) = s.get("items") {
                for (i, item) in items.iter().enumerate() {
                    self.check(item_schema, item, &format!("{at}[{i}]"), errs);
                }
            }
        }
        for sub in s.get("allOf").and_then(Value::as_array).into_iter().flatten() {
            self.check(sub, v, at, errs);
        }
        if let Some(subs) = s.get("anyOf").and_then(Value::as_array) {
            if !subs.iter().any(|sub| self.matches(sub, v, at)) {
                errs.push(format!("{at}: matches none of anyOf"));
            }
        }
        if let Some(subs) = s.get("oneOf").and_then(Value::as_array) {
            let n = subs.iter().filter(|sub| self.matches(sub, v, at)).count();
            if n != 1 {
                errs.push(format!("{at}: matches {n} of oneOf, not exactly one"));
            }
        }
    }

    fn check_object(
        &self,
        s: &serde_json::Map<String, Value>,
        obj: &serde_json::Map<String, Value>,
        at: &str,
        errs: &mut Vec<String>,
    ) {
        for key in s.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
            if !obj.contains_key(key) {
                errs.push(format!("{at}: required key {key:?} is missing"));
            }
        }
        let props = s.get("properties").and_then(Value::as_object);
        for (key, val) in obj {
            let here = format!("{at}.{key}");
            if let Some(prop) = props.and_then(|p| p.get(key)) {
                self.check(prop, val, &here, errs);
                continue;
            }
            match s.get("additionalProperties") {
                Some(Value::Bool(false)) => errs.push(format!("{here}: key not allowed")),
                Some(extra @ Value::Object(_)) => self.check(extra, val, &here, errs),
                _ if self.undeclared_keys_are_errors && props.is_some() => {
                    errs.push(format!("{here}: key not declared in the document"))
                }
                _ => {}
            }
        }
    }

    fn matches(&self, schema: &Value, v: &Value, at: &str) -> bool {
        let mut errs = Vec::new();
        self.check(schema, v, at, &mut errs);
        errs.is_empty()
    }
}

fn has_type(t: &str, v: &Value) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => false,
    }
}

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc() -> Value {
        json!({"components": {"schemas": {
            "Thing": {
                "type": "object",
                "required": ["id", "count"],
                "additionalProperties": true,
                "properties": {
                    "id": {"type": "string"},
                    "count": {"type": "integer", "minimum": 0},
                    "note": {"type": "string"},
                    "exit": {"type": ["integer", "null"]},
                    "kind": {"type": "string", "enum": ["a", "b"]},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}}
                }
            },
            "Closed": {"type": "object", "additionalProperties": false, "properties": {"x": {"type": "boolean"}}},
            "Either": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "Any": {"anyOf": [{"$ref": "#/components/schemas/Closed"}, {"type": "null"}]}
        }}})
    }

    fn check(schema: &str, v: Value) -> Result<(), Vec<String>> {
        let d = doc();
        let s = json!({"$ref": format!("#/components/schemas/{schema}")});
        Validator::new(&d).validate(&s, &v)
    }

    #[test]
    fn accepts_a_conforming_value() {
        let v =
            json!({"id": "x", "count": 2, "exit": null, "kind": "a", "tags": ["t"], "labels": {"k": "v"}, "extra": 1});
        assert_eq!(check("Thing", v), Ok(()));
        assert_eq!(check("Thing", json!({"id": "x", "count": 0, "exit": 3})), Ok(()));
    }

    #[test]
    fn rejects_a_missing_required_key() {
        let errs = check("Thing", json!({"id": "x"})).unwrap_err();
        assert!(errs.iter().any(|e| e.contains("\"count\" is missing")), "{errs:?}");
    }

    #[test]
    fn rejects_a_wrong_type() {
        let errs = check("Thing", json!({"id": 7, "count": 1.5})).unwrap_err();
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs[0].starts_with("$.count: expected integer") || errs[1].starts_with("$.count: expected integer"));
        assert!(check("Thing", json!({"id": "x", "count": 1, "tags": ["a", 2]})).is_err());
        assert!(check("Thing", json!({"id": "x", "count": 1, "labels": {"k": 1}})).is_err());
        assert!(check("Thing", json!([])).is_err());
    }

    #[test]
    fn rejects_null_where_not_allowed() {
        assert!(check("Thing", json!({"id": "x", "count": 1, "note": null})).is_err());
        assert!(check("Thing", json!({"id": null, "count": 1})).is_err());
        assert!(check("Thing", json!({"id": "x", "count": 1, "exit": null})).is_ok());
    }

    #[test]
    fn enums_minimums_and_closed_objects() {
        assert!(check("Thing", json!({"id": "x", "count": 1, "kind": "c"})).is_err());
        assert!(check("Thing", json!({"id": "x", "count": -1})).is_err());
        assert!(check("Closed", json!({"x": true, "y": 1})).is_err());
        assert!(check("Closed", json!({"x": true})).is_ok());
    }

    #[test]
    fn any_of_and_one_of() {
        assert!(check("Either", json!("s")).is_ok());
        assert!(check("Either", json!(true)).is_err());
        assert!(check("Any", json!(null)).is_ok());
        assert!(check("Any", json!({"x": 1})).is_err());
    }

    #[test]
    fn strict_mode_rejects_undeclared_keys_and_bad_refs_fail() {
        let d = doc();
        let s = json!({"$ref": "#/components/schemas/Thing"});
        let v = json!({"id": "x", "count": 1, "surprise": true});
        assert!(Validator::new(&d).validate(&s, &v).is_ok());
        assert!(Validator::strict(&d).validate(&s, &v).is_err());
        assert!(Validator::new(&d).validate(&json!({"$ref": "#/components/schemas/Nope"}), &json!(1)).is_err());
    }
}
