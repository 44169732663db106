//! Relative encodings: terms inside attention that depend on the distance
//! between query and key ([`Hook::Logits`](crate::Hook::Logits),
//! [`Hook::Values`](crate::Hook::Values)).
