//! Adding up provider `usage` objects: a handoff made in several calls costs their sum.

use serde_json::{Map, Value};

/// The sum of the numeric fields of `usages` (nested objects such as
/// `prompt_tokens_details` are summed field by field); `None` when none was given.
pub fn sum_usage<'a>(usages: impl IntoIterator<Item = &'a Value>) -> Option<Value> {
    let mut total: Option<Map<String, Value>> = None;
    for usage in usages {
        if let Some(fields) = usage.as_object() {
            add_into(total.get_or_insert_with(Map::new), fields);
        }
    }
    total.map(Value::Object)
}

fn add_into(total: &mut Map<String, Value>, fields: &Map<String, Value>) {
    for (key, value) in fields {
        match value {
            Value::Number(n) => {
                let sum = match (total.get(key).and_then(Value::as_u64), n.as_u64()) {
                    (Some(a), Some(b)) => Value::from(a + b),
                    (None, Some(b)) => Value::from(b),
                    _ => {
                        let a = total.get(key).and_then(Value::as_f64).unwrap_or(0.0);
                        Value::from(a + n.as_f64().unwrap_or(0.0))
                    }
                };
                total.insert(key.clone(), sum);
            }
            Value::Object(inner) => {
                let slot = total
                    .entry(key.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(slot) = slot {
                    add_into(slot, inner);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_add_up_field_by_field_and_nested() {
        let a = json!({"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 4}});
        let b = json!({"prompt_tokens": 5, "completion_tokens": 3, "cost": 0.5, "prompt_tokens_details": {"cached_tokens": 1}});
        assert_eq!(
            sum_usage([&a, &b]),
            Some(
                json!({"prompt_tokens": 15, "completion_tokens": 5, "cost": 0.5, "prompt_tokens_details": {"cached_tokens": 5}})
            )
        );
        assert_eq!(sum_usage([]), None);
    }
}
