#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| lean_fuzz::model(data));
