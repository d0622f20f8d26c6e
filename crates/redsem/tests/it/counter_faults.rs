//! Faults of the permit semaphore and the countdown latch, each reproduced on throwaway
//! servers (see `redsem-test`).
