//! Hot reload: on SIGHUP and on a (debounced) change of the config file, the config
//! is loaded and validated in full and swapped whole; an invalid file keeps the old one.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use notify_debouncer_mini::notify::{RecommendedWatcher, RecursiveMode};
use notify_debouncer_mini::{new_debouncer, DebounceEventResult, Debouncer};
use tokio::sync::mpsc;

use crate::state::AppState;

/// The cause a file event sends.
const FILE_CHANGE: &str = "file change";

/// Quiet time after the last change before the file is read: editors write in steps.
const DEBOUNCE: Duration = Duration::from_millis(250);

/// Reloads `state` whenever a message arrives on the returned sender.
pub(crate) fn spawn_reloader(state: Arc<AppState>) -> mpsc::Sender<&'static str> {
    let (sender, mut receiver) = mpsc::channel::<&'static str>(1);
    tokio::spawn(async move {
        while let Some(cause) = receiver.recv().await {
            let state = Arc::clone(&state);
            // SIGHUP always reloads (a prompt file may have changed); a file event only
            // when the config did.
            let file_event = cause == FILE_CHANGE;
            let outcome = tokio::task::spawn_blocking(move || state.reload(file_event)).await;
            if let Ok(Err(err)) = outcome {
                tracing::warn!(cause, error = %err, "reload failed");
            }
        }
    });
    sender
}

/// Watches the config file's folder (editors replace files by renaming) and asks for
/// a reload when the file changes. The watcher stops when the returned value drops.
pub(crate) fn watch_config_file(
    file: PathBuf,
    reload: mpsc::Sender<&'static str>,
) -> Option<Debouncer<RecommendedWatcher>> {
    let target = std::fs::canonicalize(&file).unwrap_or_else(|_| file.clone());
    let folder = target.parent()?.to_owned();
    let name = target.file_name()?.to_owned();
    let mut debouncer = new_debouncer(DEBOUNCE, move |events: DebounceEventResult| {
        let touched = events
            .map(|events| {
                events
                    .iter()
                    .any(|e| e.path.file_name() == Some(name.as_os_str()))
            })
            .unwrap_or(false);
        // A full queue already holds a pending reload, which will read the newest file.
        if touched {
            let _ = reload.try_send(FILE_CHANGE);
        }
    })
    .map_err(|err| tracing::warn!(error = %err, "cannot watch the config file; reload with SIGHUP"))
    .ok()?;
    if let Err(err) = debouncer
        .watcher()
        .watch(&folder, RecursiveMode::NonRecursive)
    {
        tracing::warn!(error = %err, folder = %folder.display(), "cannot watch the config folder; reload with SIGHUP");
        return None;
    }
    tracing::info!(file = %target.display(), "watching the config file for changes");
    Some(debouncer)
}
