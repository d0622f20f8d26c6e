//! What a release leaves to happen later, driven through faults: the grant it hands to a
//! waiter of its own process when its reply is lost, and the idle TTL it leaves to
//! `lease_tidy`.
