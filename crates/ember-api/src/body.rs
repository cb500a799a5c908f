//! Request bodies: JSON decoded into the route's type with errors that name the
//! failing field, as a `{code, message}` 400.
//!
//! JSON Schema, and so the OpenAPI 3.1 document clients generate from, counts
//! `3.0` as an integer; serde does not. Integral numbers written with a
//! fraction are therefore made integers before decoding, so that a body the
//! document accepts is never refused for its spelling of a number.

use serde::de::DeserializeOwned;
use serde_json::{Number, Value};

use crate::error::ApiError;

/// Decodes a parsed body into `T`, naming the field that does not fit.
pub(crate) fn decode_value<T: DeserializeOwned>(mut v: Value) -> Result<T, ApiError> {
    integral_numbers(&mut v);
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        ApiError::bad_request(if path == "." {
            format!("invalid request body: {inner}")
        } else {
            format!("invalid request body: {path}: {inner}")
        })
    })
}

/// Decodes raw bytes (a route that reads its body itself).
pub(crate) fn decode_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let v: Value =
        serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))?;
    decode_value(v)
}

/// Rewrites every float with no fractional part that an `i64` holds exactly
/// (|x| ≤ 2^53) as that integer; anything else is left for serde to judge.
fn integral_numbers(v: &mut Value) {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    match v {
        Value::Number(n) if n.is_f64() => {
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() <= EXACT) {
                *n = Number::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_numbers),
        Value::Object(map) => map.values_mut().for_each(integral_numbers),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    struct Fork {
        count: u32,
        ratio: Option<f64>,
        nested: Option<Vec<u16>>,
    }

    #[test]
    fn an_integral_float_is_an_integer_as_json_schema_says() {
        let f: Fork = decode_slice(br#"{"count": 286.0, "ratio": 2.0, "nested": [1.0, 2]}"#).unwrap();
        assert_eq!((f.count, f.ratio, f.nested), (286, Some(2.0), Some(vec![1, 2])));
    }

    #[test]
    fn a_fraction_or_an_inexact_float_is_still_refused_naming_the_field() {
        for body in [r#"{"count": 1.5}"#, r#"{"count": 1e300}"#, r#"{"count": -1.0}"#] {
            let e = decode_slice::<Fork>(body.as_bytes()).unwrap_err();
            assert!(e.message.contains("count"), "{body}: {}", e.message);
        }
        let e = decode_slice::<Fork>(br#"{"count": 1, "nested": [1, 70000.0]}"#).unwrap_err();
        assert!(e.message.contains("nested[1]"), "{}", e.message);
    }
}
