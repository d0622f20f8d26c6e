//! The `tracing` spans along a permit's life, seen by a subscriber as a user's would be.
//!
//! A test binary of its own: the subscriber is the process-wide default, so that no other
//! test's threads race the registration of the spans' call sites.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redsem::{LeaseOptions, Redsem};
use redsem_test::{RedisServer, within};
use tracing::Subscriber;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;

/// The bound of every wait.
const LIMIT: Duration = Duration::from_secs(10);

/// A closed span: its name, its fields, and its parent's name.
#[derive(Debug, Clone)]
struct Closed {
    name: &'static str,
    fields: HashMap<String, String>,
    parent: Option<&'static str>,
}

#[derive(Default)]
struct Fields(HashMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
}

/// Keeps every closed span.
struct Spans(Arc<Mutex<Vec<Closed>>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<Fields>()
        {
            values.record(fields);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            let fields = span
                .extensions()
                .get::<Fields>()
                .map(|f| f.0.clone())
                .unwrap_or_default();
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Closed {
                    name: span.name(),
                    fields,
                    parent: span.parent().map(|p| p.name()),
                });
        }
    }
}

#[tokio::test]
async fn spans_follow_a_permit_from_acquire_to_release() {
    let closed = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(Spans(closed.clone()));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    let server = RedisServer::start();
    let redsem = within(LIMIT, "connect", Redsem::connect(&server.url()))
        .await
        .expect("connect");
    let lease = Duration::from_millis(90);
    let options = LeaseOptions::default().lease(lease).waiter_lease(lease);
    let sem = redsem
        .lease_semaphore_with("obs-spans", 2, options)
        .expect("sem");
    let permit = within(LIMIT, "acquire", sem.acquire())
        .await
        .expect("acquire");
    let (id, token) = (permit.id().to_string(), permit.token().to_string());
    tokio::time::sleep(Duration::from_millis(100)).await; // a renewal or two
    within(LIMIT, "release", permit.release())
        .await
        .expect("release");
    within(LIMIT, "flush", redsem.flush()).await;
    // The keepalive may hold the permit's state a moment longer: its span closes with it.
    let find = |name: &str| {
        closed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|s| s.name == name && s.fields.get("id") == Some(&id))
            .cloned()
    };
    within(LIMIT, "the permit span closes", async {
        while find("redsem.permit").is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let acquire = find("redsem.acquire").expect("an acquire span with the permit id");
    for (field, value) in [
        ("name", "obs-spans"),
        ("primitive", "lease"),
        ("units", "1"),
        ("token", token.as_str()),
        ("outcome", "granted"),
    ] {
        assert_eq!(
            acquire.fields.get(field).map(String::as_str),
            Some(value),
            "{acquire:?}"
        );
    }
    let permit = find("redsem.permit").expect("permit span");
    assert_eq!(permit.fields.get("token"), Some(&token));
    let all = closed.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let release = all
        .iter()
        .find(|s| s.name == "redsem.release")
        .unwrap_or_else(|| panic!("a release span: {all:?}"));
    assert_eq!(release.parent, Some("redsem.permit"));
    assert_eq!(
        release.fields.get("outcome").map(String::as_str),
        Some("released")
    );
    assert!(
        all.iter()
            .any(|s| s.name == "redsem.renew" && s.parent == Some("redsem.permit")),
        "renewals run inside the permit's span: {all:?}"
    );
}
