//! Absolute encodings: a vector per position, added to the token embeddings
//! at the input ([`Hook::Input`](crate::Hook::Input)).
