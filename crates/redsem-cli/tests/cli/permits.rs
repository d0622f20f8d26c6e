use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::World;

#[test]
fn try_set_sets_the_permits_once_and_exits_1_naming_them_when_already_set() {
    let world = World::new();
    assert_eq!(world.available("gpu"), 0, "never set");
    let out = world.run(&["permits", "gpu", "try-set", "3"]).success();
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    assert_eq!(world.available("gpu"), 3);

    let out = world.run(&["permits", "gpu", "try-set", "5"]).expect(1);
    assert!(
        out.error()
            .contains("the permits of \"gpu\" are already set (3 available)"),
        "{out:?}"
    );
    assert_eq!(world.available("gpu"), 3, "left as they were");
}

#[test]
fn try_set_0_closes_the_permits_until_some_are_added() {
    let world = World::new();
    world.run(&["permits", "gate", "try-set", "0"]).success();
    world.run(&["permits", "gate", "try-set", "2"]).expect(1);
    world
        .run(&["permits", "gate", "acquire", "--no-wait"])
        .expect(75);
    world.run(&["permits", "gate", "add", "1"]).success();
    world
        .run(&["permits", "gate", "acquire", "--no-wait"])
        .success();
    assert_eq!(world.available("gate"), 0);
}

#[test]
fn add_takes_permits_away_with_a_negative_number_even_below_zero() {
    let world = World::new();
    world.run(&["permits", "fresh", "add", "-5"]).success();
    assert_eq!(world.available("fresh"), -5);

    world.run(&["permits", "gpu", "try-set", "2"]).success();
    world.run(&["permits", "gpu", "add", "-3"]).success();
    let out = world.run(&["permits", "gpu", "available"]).success();
    assert_eq!(out.stdout, "-1\n");
    world.run(&["permits", "gpu", "add", "4"]).success();
    assert_eq!(world.available("gpu"), 3);

    // At most 2^53 - 1 in all: a step past it is refused and changes nothing.
    world
        .run(&["permits", "big", "add", "9007199254740991"])
        .success();
    for args in [&["add", "1"][..], &["release"][..]] {
        let mut all = vec!["permits", "big"];
        all.extend_from_slice(args);
        let out = world.run(&all).expect(2);
        assert!(out.error().contains("9007199254740991"), "{out:?}");
    }
    assert_eq!(world.available("big"), 9_007_199_254_740_991);
}

#[test]
fn acquire_takes_one_by_default_or_n_and_release_gives_them_back() {
    let world = World::new();
    world.run(&["permits", "gpu", "try-set", "5"]).success();
    let out = world.run(&["permits", "gpu", "acquire"]).success();
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    assert_eq!(world.available("gpu"), 4);
    world
        .run(&["permits", "gpu", "acquire", "3", "--wait", "5s"])
        .success();
    assert_eq!(world.available("gpu"), 1);
    world.run(&["permits", "gpu", "release"]).success();
    assert_eq!(world.available("gpu"), 2);
    world.run(&["permits", "gpu", "release", "3"]).success();
    assert_eq!(world.available("gpu"), 5);
}

#[test]
fn acquire_no_wait_exits_75_when_too_few_are_free_and_takes_nothing() {
    let world = World::new();
    world.run(&["permits", "gpu", "try-set", "2"]).success();
    let out = world
        .run(&["permits", "gpu", "acquire", "3", "--no-wait"])
        .expect(75);
    assert!(
        out.error()
            .contains("3 permits of \"gpu\" not available (2 available"),
        "{out:?}"
    );
    assert!(out.stdout.is_empty(), "{out:?}");
    assert_eq!(world.available("gpu"), 2);
}

#[test]
fn acquire_exits_75_when_the_wait_runs_out_honoured_within_200ms_and_takes_nothing() {
    let world = World::new();
    world.run(&["permits", "gpu", "try-set", "1"]).success();
    let out = world
        .run(&["permits", "gpu", "acquire", "2", "--wait", "500ms"])
        .expect(75);
    assert!(
        out.elapsed >= Duration::from_millis(500) && out.elapsed <= Duration::from_millis(700),
        "--wait 500ms took {:?}",
        out.elapsed
    );
    assert!(
        out.error().contains("2 permits of \"gpu\" not free within"),
        "{out:?}"
    );
    assert!(out.error().contains("timed out"), "{out:?}");
    assert_eq!(world.permit_waiters("gpu"), 0, "the request left the queue");
    world.run(&["permits", "gpu", "release"]).success();
    assert_eq!(
        world.available("gpu"),
        2,
        "the timed-out request took nothing"
    );
}

#[test]
fn a_waiting_acquire_of_4_returns_as_soon_as_4_are_free_and_not_before() {
    let world = World::new();
    world.run(&["permits", "gpu", "try-set", "5"]).success();
    world.run(&["permits", "gpu", "acquire", "3"]).success();
    // (--quiet: a wait over 300 ms, as on a loaded machine, would print its waiting line.)
    let mut waiter = world.start(&["permits", "gpu", "acquire", "4", "--quiet"]);
    world.wait_for_permit_waiters("gpu", 1);
    world.run(&["permits", "gpu", "release"]).success();
    assert_eq!(world.permit_waiters("gpu"), 1, "still waits with 3 free");
    assert!(!waiter.has_exited());
    world.run(&["permits", "gpu", "release"]).success();
    let released = Instant::now();
    // Woken by the release's message, not by its check-in a few seconds later.
    let out = waiter.wait_within(Duration::from_millis(500)).success();
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    assert!(released.elapsed() < Duration::from_millis(500));
    assert_eq!(world.available("gpu"), 0);
}

#[test]
fn a_signal_while_waiting_withdraws_the_request_and_takes_nothing() {
    let world = World::new();
    world.run(&["permits", "gpu", "try-set", "1"]).success();
    let waiter = world.start(&["permits", "gpu", "acquire", "2"]);
    world.wait_for_permit_waiters("gpu", 1);
    waiter.signal(Signal::SIGINT);
    let out = waiter.wait().expect(130);
    assert!(
        out.error()
            .contains("interrupted by SIGINT while waiting for 2 permits of \"gpu\""),
        "{out:?}"
    );
    assert_eq!(world.permit_waiters("gpu"), 0, "the request was withdrawn");
    world.run(&["permits", "gpu", "release"]).success();
    assert_eq!(world.available("gpu"), 2, "nothing was taken");
}

#[test]
fn permits_are_kept_apart_by_the_prefix() {
    let world = World::new();
    world
        .run(&["--prefix", "one", "permits", "gpu", "try-set", "1"])
        .success();
    world
        .run(&["--prefix", "two", "permits", "gpu", "try-set", "2"])
        .success();
    let out = world
        .run(&["--prefix", "two", "permits", "gpu", "available"])
        .success();
    assert_eq!(out.stdout, "2\n");
    assert_eq!(
        world.available("gpu"),
        0,
        "nothing under the default prefix"
    );
}
