//! Faults of the lease semaphore, each reproduced on throwaway servers (see `redsem-test`).
