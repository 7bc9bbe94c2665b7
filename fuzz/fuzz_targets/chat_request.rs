//! A `POST /v1/chat/completions` (and `/v1/completions`) body through the server's wire format
//! and its request checks (`mlxcel_fuzz::chat_request` says what must hold).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mlxcel_fuzz::chat_request(data));
