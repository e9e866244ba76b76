//! What the syncer caches, kept small: the watch-fed [`stores`] (and the [`slim_store`] for the kinds with
//! a record per pod), pods as the caches keep them ([`pods`]), labels and annotations packed ([`meta`]),
//! parts many records share kept once ([`interned`]) and the super cluster's caches ([`super_stores`]). What the
//! syncer wrote of the shared token Secrets is the tokens' ([`crate::tokens::records`]).

pub mod interned;
pub mod meta;
pub mod pods;
pub mod slim_store;
pub mod stores;
pub mod super_stores;
