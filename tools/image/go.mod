// Module image builds the tracer's container image without a container
// daemon (make image). It is a module of its own so the product's go.mod
// never pulls go-containerregistry.
module github.com/tracer-dev/tracer/tools/image

go 1.26.0

require github.com/google/go-containerregistry v0.22.1

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
)
