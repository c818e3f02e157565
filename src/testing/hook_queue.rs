//! A hook that serves one call at a time (as an `exec` hook's one process does), on
//! the in-process harness on paused time: its `timeout` measures its own work, not the
//! wait for its turn, so one tenant's load neither skips another's fail-open hook nor
//! refuses its fail-closed one. A tenant past its `queue` fails at once, as the hook's
//! `failure` says.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join, join_all, BoxFuture};
use futures_util::FutureExt;
use handoff_plugin_api::{Hook, HookDecision, HookError, HookRequest};
use mock_upstream::{MockUpstream, Reply};
use serde_json::json;

use crate::config::HookConfig;
use crate::plugins::register_hook;
use crate::testing::{sha256_hex, Harness};

/// Takes 100 ms a call, one call at a time.
struct OneAtATime(tokio::sync::Mutex<()>);

impl Hook for OneAtATime {
    fn kind(&self) -> &'static str {
        "test_one_at_a_time"
    }

    fn concurrency(&self) -> Option<usize> {
        Some(1)
    }

    fn on_request<'a>(
        &'a self,
        _: &'a HookRequest,
    ) -> BoxFuture<'a, Result<HookDecision, HookError>> {
        async move {
            let _one = self.0.lock().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(HookDecision::default())
        }
        .boxed()
    }
}

fn one_at_a_time(_: &HookConfig) -> Result<Arc<dyn Hook>, String> {
    Ok(Arc::new(OneAtATime(tokio::sync::Mutex::new(()))))
}

#[tokio::test(start_paused = true)]
async fn one_tenant_s_load_does_not_fail_another_tenant_s_hook() {
    register_hook("test_one_at_a_time", one_at_a_time);
    let mock = MockUpstream::replying(Reply::chat_text("fine")).await;
    let config = format!(
        "[middleware]\nchain = [\"policy\"]\n\
         [middleware.hooks.policy]\nkind = \"test_one_at_a_time\"\ntimeout = \"150ms\"\n\
         queue = 2\nqueue_wait = \"10s\"\n\
         [[auth.keys]]\nname = \"team-a\"\nsha256 = \"{}\"\n\
         [[auth.keys]]\nname = \"team-b\"\nsha256 = \"{}\"\n",
        sha256_hex("hk-team-a-123456"),
        sha256_hex("hk-team-b-123456")
    );
    let proxy = Harness::start(&mock.url(), &config).await;
    let ask = |key: &'static str| {
        let proxy = &proxy;
        async move {
            let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
            let bearer = format!("Bearer {key}");
            proxy
                .post(
                    "/v1/chat/completions",
                    &[("authorization", bearer.as_str())],
                    body.to_string().as_bytes(),
                )
                .await
        }
    };
    // team-a sends eight at once; team-b one, while team-a's wait.
    let team_a = join_all((0..8).map(|_| ask("hk-team-a-123456")));
    let team_b = async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        ask("hk-team-b-123456").await
    };
    let (team_a, team_b) = join(team_a, team_b).await;
    assert_eq!(team_b.status, 200, "{}", team_b.text());
    let passed = team_a.iter().filter(|got| got.status == 200).count();
    assert_eq!(passed, 3, "one call at the hook and two waiting");
    for refused in team_a.iter().filter(|got| got.status != 200) {
        assert_eq!(refused.status, 503, "{}", refused.text());
        assert!(
            refused.text().contains("calls waiting"),
            "{}",
            refused.text()
        );
    }
}
