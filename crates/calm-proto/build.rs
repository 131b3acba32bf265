//! Generates the gRPC code from proto/calm.proto (needs `protoc`, from Debian's
//! protobuf-compiler; scripts/test and scripts/run install it when missing).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/calm.proto");
    tonic_prost_build::configure().compile_protos(&["proto/calm.proto"], &["proto"])?;
    Ok(())
}
