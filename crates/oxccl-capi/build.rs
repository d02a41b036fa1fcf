//! The cdylib is named libnccl.so; its soname is libnccl.so.2, NCCL's, so programs linked with
//! `-lnccl` (against either library) record the name under which the loader finds ours.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!("cargo:rerun-if-changed=build.rs");
}
