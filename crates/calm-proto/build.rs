//! Generates the gRPC code from proto/calm.proto (needs `protoc`, from Debian's
//! protobuf-compiler; scripts/test and scripts/run install it when missing), and the list of
//! its methods (`methods.rs`: what the server's metrics count requests by).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/calm.proto");
    tonic_prost_build::configure().compile_protos(&["proto/calm.proto"], &["proto"])?;
    let proto = std::fs::read_to_string("proto/calm.proto")?;
    let mut package = String::new();
    let mut service = String::new();
    let mut methods = Vec::new();
    for line in proto.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["package", name, ..] => package = name.trim_end_matches(';').to_string(),
            ["service", name, ..] => service = name.to_string(),
            ["rpc", call, ..] => {
                let name = call.split('(').next().unwrap_or(call);
                methods.push(format!("{package}.{service}/{name}"));
            }
            _ => {}
        }
    }
    let out = std::path::Path::new(&std::env::var("OUT_DIR")?).join("methods.rs");
    std::fs::write(out, format!("pub const METHODS: &[&str] = &{methods:?};\n"))?;
    Ok(())
}
