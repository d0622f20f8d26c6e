//! A hash as a general native call sees it (the lease's state hash, the permits' records):
//! each field read once and kept, the call's changes over it, and the write-back at the end
//! as the Lua's save() does it (the changed fields by HSET, the deleted ones by HDEL).

use std::ffi::{c_char, c_int};
use std::ptr;

use crate::api::{self, RedisModuleCtx, RedisModuleKey, RedisModuleString, Str, api, raw};
use crate::replicate::Effects;

/// The fields a call read (None: absent) and whether it changed them.
#[derive(Debug)]
pub(crate) struct Fields {
    key: *mut RedisModuleKey,
    pub(crate) cache: Vec<(Vec<u8>, Option<Vec<u8>>, bool)>,
}

impl Fields {
    pub(crate) fn new(key: *mut RedisModuleKey) -> Fields {
        Fields {
            key,
            cache: Vec::new(),
        }
    }

    /// `field(name)`: read once, then as the call left it (None: absent).
    pub(crate) unsafe fn get(&mut self, ctx: *mut RedisModuleCtx, name: &[u8]) -> Option<Vec<u8>> {
        if let Some((_, value, _)) = self.cache.iter().find(|(n, _, _)| n == name) {
            return value.clone();
        }
        let n = Str::new(ctx, name);
        let mut value: *mut RedisModuleString = ptr::null_mut();
        api!(RedisModule_HashGet)(
            self.key,
            raw::REDISMODULE_HASH_NONE as c_int,
            n.ptr,
            &mut value as *mut _,
            ptr::null::<c_char>(),
        );
        let read = (!value.is_null()).then(|| api::bytes(value).to_vec());
        api::free(ctx, value);
        self.cache.push((name.to_vec(), read.clone(), false));
        read
    }

    /// `put(name, value)` (None: deleted at the write-back).
    pub(crate) fn put(&mut self, name: &[u8], value: Option<Vec<u8>>) {
        match self.cache.iter_mut().find(|(n, _, _)| n == name) {
            Some(f) => {
                f.1 = value;
                f.2 = true;
            }
            None => self.cache.push((name.to_vec(), value, true)),
        }
    }

    /// The fields put, in the order first met.
    pub(crate) fn changed(&self) -> impl Iterator<Item = (Vec<u8>, Option<Vec<u8>>)> + '_ {
        self.cache
            .iter()
            .filter(|(_, _, dirty)| *dirty)
            .map(|(name, value, _)| (name.clone(), value.clone()))
    }

    /// Write `writes` (a value, or None: the field deleted) to the hash, whose name is
    /// `name`: the keyspace events `hset` and `hdel`, and the same HSET and HDEL replicated.
    pub(crate) unsafe fn write(
        &self,
        ctx: *mut RedisModuleCtx,
        name: *mut RedisModuleString,
        writes: &[(Vec<u8>, Option<Vec<u8>>)],
        effects: &mut Effects,
    ) {
        let replicating = effects.replicating();
        let (mut set_args, mut del_args) = (vec![name], vec![name]);
        let mut made = Vec::new();
        for (field, value) in writes {
            let n = Str::new(ctx, field);
            let v = value.as_ref().map(|v| Str::new(ctx, v));
            api!(RedisModule_HashSet)(
                self.key,
                raw::REDISMODULE_HASH_NONE as c_int,
                n.ptr,
                v.as_ref().map_or(api::HASH_DELETE, |v| v.ptr),
                ptr::null::<c_char>(),
            );
            match v {
                Some(v) => {
                    set_args.extend([n.ptr, v.ptr]);
                    made.push(v);
                }
                None => del_args.push(n.ptr),
            }
            made.push(n);
        }
        if set_args.len() > 1 {
            effects.notify(raw::REDISMODULE_NOTIFY_HASH, c"hset", name);
            if replicating {
                effects.replicate(c"HSET", &set_args);
            }
        }
        if del_args.len() > 1 {
            effects.notify(raw::REDISMODULE_NOTIFY_HASH, c"hdel", name);
            if replicating {
                effects.replicate(c"HDEL", &del_args);
            }
        }
        drop(made);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_put_replaces_the_one_read_and_is_marked_changed() {
        let mut f = Fields::new(ptr::null_mut());
        f.cache.push((b"a".to_vec(), Some(b"1".to_vec()), false));
        f.cache.push((b"b".to_vec(), Some(b"2".to_vec()), false));
        f.put(b"b", None);
        f.put(b"c", Some(b"3".to_vec()));
        assert_eq!(
            f.cache,
            vec![
                (b"a".to_vec(), Some(b"1".to_vec()), false),
                (b"b".to_vec(), None, true),
                (b"c".to_vec(), Some(b"3".to_vec()), true),
            ]
        );
        assert_eq!(
            f.changed().collect::<Vec<_>>(),
            vec![(b"b".to_vec(), None), (b"c".to_vec(), Some(b"3".to_vec()))]
        );
    }
}
