//! The bill on the record: each reply's usage at the configured `[prices]`, in
//! `audit show` (per reply and in total) and in the metrics; a model with no price is
//! unpriced, never free.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::scenario::chat_as;
use crate::support::{Proxy, ProxyOptions};
use mock_upstream::{MockUpstream, Reply};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bill_is_usage_at_the_configured_prices_and_an_unpriced_model_says_so() {
    let mock = MockUpstream::with(|_| {
        Reply::json(
            json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1,
            "model": "m", "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
                "prompt_tokens_details": {"cached_tokens": 1920}}}),
        )
    })
    .await;
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            extra_toml:
                "[prices.\"priced-model\"]\ninput = 2.5\noutput = 10.0\ncache_read = 1.25\n".into(),
            ..Default::default()
        },
    );
    let mut history = vec![json!({"role": "user", "content": "one"})];
    for next in ["two", "three"] {
        let got = chat_as(&proxy, "billed", "priced-model", &history).await;
        assert_eq!(got.status, 200, "{}", got.text());
        history.push(got.json()["choices"][0]["message"].clone());
        history.push(json!({"role": "user", "content": next}));
    }
    let got = chat_as(&proxy, "unpriced", "free-model", &history[..1]).await;
    assert_eq!(got.status, 200, "{}", got.text());

    // 86 fresh at $2.50, 1,920 cached at $1.25 and 300 out at $10 per million.
    let show = String::from_utf8(proxy.audit(&["show", "billed"]).stdout).unwrap();
    assert_eq!(show.matches(" cost=$0.005615").count(), 2, "{show}");
    assert!(
        show.contains("bill: $0.011230 for 2 priced replies\n"),
        "{show}"
    );
    let show = String::from_utf8(proxy.audit(&["show", "unpriced"]).stdout).unwrap();
    assert!(show.contains(" unpriced"), "{show}");
    assert!(
        show.contains(
            "bill: $0.000000 for 0 priced replies; 1 unpriced (no [prices] entry for free-model)"
        ),
        "{show}"
    );
    // The admin API's timeline (and the web view it feeds) carries the same bill.
    let url = format!("{}/handoff/conversations/billed/timeline", proxy.url());
    let timeline =
        crate::support::client::send(crate::support::client::request("GET", &url, &[], ""))
            .await
            .json();
    assert!(
        (timeline["bill"]["usd"].as_f64().unwrap() - 0.01123).abs() < 1e-9,
        "{}",
        timeline["bill"]
    );
    assert_eq!(timeline["bill"]["priced_replies"], 2);
    let costs: Vec<f64> = timeline["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|event| event["cost_usd"].as_f64())
        .collect();
    assert_eq!(costs.len(), 2, "each reply's cost: {costs:?}");
    let metrics = proxy.metrics().await;
    assert!(
        metrics.lines().any(|line| line
            .starts_with("handoff_cost_usd_total{price=\"priced-model\",tenant=\"t-")
            && line.ends_with("} 0.01123")),
        "{metrics}"
    );
    assert!(
        metrics.contains("handoff_unpriced_replies_total 1"),
        "{metrics}"
    );
    // The admin API totals it by price entry and by tenant.
    let spend = spend(&proxy).await;
    let usd = spend["prices"]["priced-model"]["replies_usd"]
        .as_f64()
        .unwrap();
    assert!((usd - 0.01123).abs() < 1e-9, "{spend}");
    let tenants = spend["tenants"].as_object().unwrap();
    assert_eq!(
        tenants.len(),
        1,
        "one client credential, one tenant: {spend}"
    );
    assert_eq!(spend["unpriced"]["replies"], 1.0, "{spend}");
}

/// `GET /handoff/spend`.
async fn spend(proxy: &Proxy) -> serde_json::Value {
    let url = format!("{}/handoff/spend", proxy.url());
    crate::support::client::send(crate::support::client::request("GET", &url, &[], ""))
        .await
        .json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_s_summary_calls_are_billed_to_its_conversation() {
    let (_strict, mock) = crate::support::scenario::strict_mock(4096).await;
    let prices = "[prices.\"strict\"]\ninput = 1.0\noutput = 2.0\n\
                  [prices.\"strict-16k\"]\ninput = 3.0\noutput = 15.0\n";
    let config = format!(
        "{}prepare_at = 0\n{prices}",
        crate::support::scenario::SUMMARY_16K_1S
    );
    let proxy = Proxy::start_with(
        &mock.url(),
        crate::support::scenario::options(4096, &config),
    );
    crate::support::scenario::drive_until_compaction(&proxy, "summarised", 500, 20).await;

    // What its records say the summary calls used, at the summary model's prices.
    let records = crate::support::scenario::records(&proxy, "summarised");
    let mut expected = 0.0;
    for attempt in records
        .iter()
        .flat_map(|r| r["attempts"].as_array().unwrap())
    {
        if let Some(usage) = attempt.get("usage") {
            assert_eq!(attempt["model"], "strict-16k", "{attempt}");
            let tokens = |field: &str| usage[field].as_u64().unwrap() as f64;
            expected += (tokens("prompt_tokens") * 3.0 + tokens("completion_tokens") * 15.0) / 1e6;
        }
    }
    assert!(expected > 0.0, "a summary call was made: {records:?}");
    let show = String::from_utf8(proxy.audit(&["show", "summarised"]).stdout).unwrap();
    assert!(show.contains(" summary calls cost=$"), "{show}");
    assert!(
        show.contains(&format!("summary attempts (${expected:.6})")),
        "{expected:.6} in {show}"
    );
    // The metrics and the admin API count them as they commit, for the tenant whose
    // conversation needed them.
    let metrics = proxy.metrics().await;
    let counted: f64 = metrics
        .lines()
        .filter(|line| {
            line.starts_with("handoff_summary_cost_usd_total{price=\"strict-16k\",tenant=")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!((counted - expected).abs() < 1e-9, "{expected} in {metrics}");
    let spend = spend(&proxy).await;
    let usd = spend["prices"]["strict-16k"]["summary_calls_usd"]
        .as_f64()
        .unwrap();
    assert!((usd - expected).abs() < 1e-9, "{spend}");
    let tenant_total: f64 = spend["tenants"]
        .as_object()
        .unwrap()
        .values()
        .map(|t| t["summary_calls_usd"].as_f64().unwrap())
        .sum();
    assert!((tenant_total - expected).abs() < 1e-9, "{spend}");
}
