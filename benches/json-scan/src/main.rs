//! How long finding each message of a chat body takes: serde_json borrowing each one
//! as a `RawValue` (what handoff does) against sonic-rs's lazy iteration.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

#[derive(serde::Deserialize)]
struct Body<'a> {
    #[serde(borrow)]
    messages: Vec<&'a serde_json::value::RawValue>,
    #[allow(dead_code)]
    model: &'a str,
}

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: json-scan BODY.json");
        std::process::exit(2);
    };
    let bytes = std::fs::read(&path).unwrap();
    let text = std::str::from_utf8(&bytes).unwrap();
    let n = 300;
    for round in 0..3 {
        let t = Instant::now();
        let mut total = 0usize;
        for _ in 0..n {
            let body: Body = serde_json::from_str(text).unwrap();
            total += body.messages.iter().map(|m| m.get().len()).sum::<usize>();
        }
        let serde = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        let t = Instant::now();
        let mut total2 = 0usize;
        for _ in 0..n {
            let messages = sonic_rs::get(text, &["messages"]).unwrap();
            for m in sonic_rs::to_array_iter(messages.as_raw_str()) {
                total2 += m.unwrap().as_raw_str().len();
            }
            let _model = sonic_rs::get(text, &["model"]).unwrap();
        }
        let sonic = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        // sonic-rs over the whole top-level object, each field lazily (one pass).
        let t = Instant::now();
        let mut total3 = 0usize;
        for _ in 0..n {
            for pair in sonic_rs::to_object_iter(text) {
                let (key, value) = pair.unwrap();
                if key == "messages" {
                    for m in sonic_rs::to_array_iter(value.as_raw_str()) {
                        total3 += m.unwrap().as_raw_str().len();
                    }
                }
            }
        }
        let sonic_one = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        assert_eq!(total, total2);
        assert_eq!(total, total3);
        println!("round {round}: {} bytes: serde_json borrowed RawValue {serde:.0} µs; sonic-rs get+array iter {sonic:.0} µs; sonic-rs object iter {sonic_one:.0} µs", bytes.len());
    }
}
