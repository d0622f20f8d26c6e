//! A sorted set as a native call sees it: the key, and the call's changes over it, read
//! through them and written at the end (the lease's and the permits' general paths).

use crate::api::{
    self, RedisModuleCtx, RedisModuleKey, RedisModuleString, Str, api, key_type, raw,
};
use crate::encoding;
use crate::record::{decimal_text, join};
use crate::replicate::Effects;

/// A sorted set as the call sees it: the key, and the call's changes over it (a member's
/// new score, or None: removed), written at the end.
pub(crate) struct Zset {
    pub(crate) key: *mut RedisModuleKey,
    pub(crate) changes: Vec<(Vec<u8>, Option<f64>)>,
    /// The first members as stored, read a window at a time by first() (`all`: to the end).
    heads: Vec<(f64, Vec<u8>)>,
    all: bool,
}

impl Zset {
    pub(crate) unsafe fn stored_score(
        &self,
        ctx: *mut RedisModuleCtx,
        member: &[u8],
    ) -> Option<f64> {
        if key_type(self.key) == raw::REDISMODULE_KEYTYPE_EMPTY {
            return None;
        }
        let m = Str::new(ctx, member);
        let mut score = 0f64;
        (api!(RedisModule_ZsetScore)(self.key, m.ptr, &mut score) == api::OK).then_some(score)
    }

    /// `ZSCORE`.
    pub(crate) unsafe fn score(&self, ctx: *mut RedisModuleCtx, member: &[u8]) -> Option<f64> {
        match self.changes.iter().find(|(m, _)| m == member) {
            Some((_, score)) => *score,
            None => self.stored_score(ctx, member),
        }
    }

    /// `ZADD` (a score) or `ZREM` (None).
    pub(crate) fn set(&mut self, member: &[u8], score: Option<f64>) {
        match self.changes.iter_mut().find(|(m, _)| m == member) {
            Some(change) => change.1 = score,
            None => self.changes.push((member.to_vec(), score)),
        }
    }

    /// `ZADD`, answering whether the member is new (ZADD's reply, 1).
    pub(crate) unsafe fn add(
        &mut self,
        ctx: *mut RedisModuleCtx,
        member: &[u8],
        score: f64,
    ) -> bool {
        let absent = self.score(ctx, member).is_none();
        self.set(member, Some(score));
        absent
    }

    /// `ZCARD`.
    pub(crate) unsafe fn card(&self, ctx: *mut RedisModuleCtx) -> u64 {
        let mut n = if key_type(self.key) == raw::REDISMODULE_KEYTYPE_EMPTY {
            0
        } else {
            api!(RedisModule_ValueLength)(self.key) as u64
        };
        for (member, score) in &self.changes {
            match (self.stored_score(ctx, member).is_some(), score.is_some()) {
                (false, true) => n += 1,
                (true, false) => n -= 1,
                _ => {}
            }
        }
        n
    }

    /// A sorted set with no changes yet.
    pub(crate) fn new(key: *mut RedisModuleKey) -> Zset {
        Zset {
            key,
            changes: Vec::new(),
            heads: Vec::new(),
            all: false,
        }
    }

    /// The first member (lowest score, then lowest member), as `ZRANGE key 0 0` would answer
    /// after the changes.
    pub(crate) unsafe fn first(&mut self, ctx: *mut RedisModuleCtx) -> Option<Vec<u8>> {
        let mut best: Option<(f64, Vec<u8>)> = None;
        loop {
            let unchanged = self
                .heads
                .iter()
                .find(|(_, member)| !self.changes.iter().any(|(m, _)| m == member));
            if let Some((score, member)) = unchanged {
                best = Some((*score, member.clone()));
                break;
            }
            if self.all {
                break;
            }
            self.read_heads(ctx, (self.heads.len() * 2).max(2));
        }
        for (member, score) in &self.changes {
            if let Some(score) = *score {
                let before = best
                    .as_ref()
                    .is_none_or(|(s, m)| score < *s || (score == *s && member < m));
                if before {
                    best = Some((score, member.clone()));
                }
            }
        }
        best.map(|(_, member)| member)
    }

    /// Read the first `n` members as stored (a window: a call that grants several waiters
    /// walks the set once, not once per waiter).
    unsafe fn read_heads(&mut self, ctx: *mut RedisModuleCtx, n: usize) {
        self.heads.clear();
        self.all = true;
        if key_type(self.key) == raw::REDISMODULE_KEYTYPE_EMPTY
            || api!(RedisModule_ZsetFirstInScoreRange)(
                self.key,
                f64::NEG_INFINITY,
                f64::INFINITY,
                0,
                0,
            ) != api::OK
        {
            return;
        }
        while api!(RedisModule_ZsetRangeEndReached)(self.key) == 0 {
            if self.heads.len() == n {
                self.all = false;
                break;
            }
            let mut score = 0f64;
            let element = api!(RedisModule_ZsetRangeCurrentElement)(self.key, &mut score);
            self.heads.push((score, api::bytes(element).to_vec()));
            api::free(ctx, element);
            api!(RedisModule_ZsetRangeNext)(self.key);
        }
        api!(RedisModule_ZsetRangeStop)(self.key);
    }

    /// Write the changes; replicated as ZADD / ZREM.
    pub(crate) unsafe fn write(
        &self,
        ctx: *mut RedisModuleCtx,
        name: *mut RedisModuleString,
        effects: &mut Effects,
    ) {
        let (mut added, mut removed) = (false, false);
        let adds = self.changes.iter().filter(|(_, s)| s.is_some()).count();
        if adds > 0 && key_type(self.key) != raw::REDISMODULE_KEYTYPE_EMPTY {
            let stored = api!(RedisModule_ValueLength)(self.key);
            encoding::crowded(ctx, self.key, stored + adds);
        }
        // The removals first: the insertions then walk a shorter set.
        let (gone, kept): (Vec<_>, Vec<_>) = self.changes.iter().partition(|(_, s)| s.is_none());
        for (member, score) in gone.into_iter().chain(kept) {
            let m = Str::new(ctx, member);
            match score {
                Some(score) => {
                    let mut flags = 0;
                    api!(RedisModule_ZsetAdd)(self.key, *score, m.ptr, &mut flags);
                    added = true;
                    if effects.replicating() {
                        let s = Str::new(ctx, &decimal_score(*score));
                        effects.replicate(c"ZADD", &[name, s.ptr, m.ptr]);
                    }
                }
                None => {
                    let mut deleted = 0;
                    if key_type(self.key) != raw::REDISMODULE_KEYTYPE_EMPTY {
                        api!(RedisModule_ZsetRem)(self.key, m.ptr, &mut deleted);
                    }
                    removed |= deleted != 0;
                    if deleted != 0 && effects.replicating() {
                        effects.replicate(c"ZREM", &[name, m.ptr]);
                    }
                }
            }
        }
        if added {
            effects.notify(raw::REDISMODULE_NOTIFY_ZSET, c"zadd", name);
        }
        if removed {
            effects.notify(raw::REDISMODULE_NOTIFY_ZSET, c"zrem", name);
        }
    }
}

/// A score as `%d` (every score written here is an integer).
pub(crate) fn decimal_score(score: f64) -> Vec<u8> {
    if score < 0.0 {
        join(&[b"-", &decimal_text((-score) as u64)])
    } else {
        decimal_text(score as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_score_is_written_as_the_lua_writes_it() {
        assert_eq!(decimal_score(1_500.0), b"1500");
        assert_eq!(decimal_score(0.0), b"0");
        assert_eq!(decimal_score(-1_500.0), b"-1500");
    }

    #[test]
    fn a_sorted_set_keeps_one_change_per_member_the_last() {
        let mut z = Zset::new(std::ptr::null_mut());
        z.set(b"a", Some(1.0));
        z.set(b"b", Some(2.0));
        z.set(b"a", None);
        z.set(b"b", Some(3.0));
        assert_eq!(
            z.changes,
            vec![(b"a".to_vec(), None), (b"b".to_vec(), Some(3.0))]
        );
    }
}
