//! Compiles `proto/inventory.proto` for the tonic example (`src/grpc.rs`)
//! with protox, a pure-Rust protobuf compiler, so building needs no
//! `protoc`; tonic-prost-build generates the messages, client and server.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/inventory.proto");
    let descriptors = protox::compile(["proto/inventory.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
