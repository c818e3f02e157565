//! The scripted coding model as a server, to try a real agent through handoff by hand:
//! `scripted-model ADDR WINDOW DIR [FILES]` writes the task's files into DIR, prints
//! `listening on ADDR` and the task's prompt, and serves until Ctrl-C. With
//! `SCRIPTED_NATIVE=off` it has none of the APIs' own compaction, as a self-hosted
//! server: its trigger, items, `context_management` and `/responses/compact` refused.
//! With `SCRIPTED_SOCKETS=on` it serves the Responses API's WebSocket mode too.

use std::sync::Arc;

use mock_upstream::scripted::{self, ScriptedCoder, Thinking};
use mock_upstream::MockUpstream;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let addr = args
        .get(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| ([127, 0, 0, 1], 0).into());
    let window = args.get(2).and_then(|w| w.parse().ok()).unwrap_or(40_000);
    let dir = std::path::PathBuf::from(args.get(3).map_or(".", String::as_str));
    let files = args.get(4).and_then(|f| f.parse().ok()).unwrap_or(12);
    if let Err(err) = scripted::write_files(&dir, files) {
        eprintln!(
            "cannot write the task's files into {}: {err}",
            dir.display()
        );
        std::process::exit(2);
    }
    let model = ScriptedCoder::new(window, files, dir, Thinking::Some);
    model.set_native(std::env::var("SCRIPTED_NATIVE").map_or(true, |v| v != "off"));
    let answer = Arc::clone(&model);
    let mock = MockUpstream::serve_on(addr, move |request| answer.answer(request)).await;
    mock.serve_sockets(std::env::var("SCRIPTED_SOCKETS").is_ok_and(|v| v == "on"));
    println!("listening on {}", mock.addr());
    println!("task: {}", scripted::task_prompt(files));
    let _ = tokio::signal::ctrl_c().await;
}
