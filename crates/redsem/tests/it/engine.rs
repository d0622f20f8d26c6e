//! The engine chosen at connect where no server has redsem's module: `Auto` serves by the
//! scripts and says why, `Native` refuses to connect naming the server, `Scripts` asks
//! nothing. (With the module loaded: crates/redsem-module/tests/client.rs.)

use redsem::{Engine, Error, RedsemOptions, ServingEngine};

use crate::support::*;

both_topologies!(
    without_the_module_auto_serves_by_the_scripts_and_native_refuses,
    multi_thread
);
async fn without_the_module_auto_serves_by_the_scripts_and_native_refuses(
    ctx: &TestContext<Topology>,
) {
    let ports: Vec<String> = ctx
        .server
        .nodes()
        .iter()
        .map(|node| format!(":{}", node.port()))
        .collect();
    // The default, Auto: the scripts, and what the server answered.
    match ctx.redsem.engine() {
        ServingEngine::Scripts { why, .. } => {
            assert!(why.contains("unknown command"), "{why}");
            assert!(
                ports.iter().any(|port| why.contains(port.as_str())),
                "{why}"
            );
        }
        other => panic!("no module anywhere, yet {other:?}"),
    }
    let sem = ctx
        .redsem
        .lease_semaphore("engine", 1)
        .expect("a semaphore");
    cycle(&sem).await.expect("a cycle by the scripts");

    let options = |engine| RedsemOptions::default().prefix(&ctx.prefix).engine(engine);
    match ctx.connect_with(options(Engine::Native)).await {
        Err(Error::EngineUnavailable { asked, node, reply }) => {
            assert_eq!(asked, Engine::Native);
            assert!(
                ports.iter().any(|port| node.ends_with(port.as_str())),
                "{node}"
            );
            assert!(reply.contains("unknown command"), "{reply}");
        }
        other => panic!("expected EngineUnavailable, got {other:?}"),
    }
    let err = ctx
        .connect_with(options(Engine::Native))
        .await
        .expect_err("no module");
    assert!(
        err.to_string()
            .starts_with("the native engine was asked for, but "),
        "{err}"
    );

    let scripts = ctx
        .connect_with(options(Engine::Scripts))
        .await
        .expect("connected");
    match scripts.engine() {
        ServingEngine::Scripts { why, .. } => assert_eq!(why, "the scripts were asked for"),
        other => panic!("{other:?}"),
    }
    assert_eq!(scripts.engine().to_string(), "scripts");
}
