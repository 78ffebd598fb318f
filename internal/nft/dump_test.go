package nft

import (
	"os"
	"testing"

	"github.com/tracer-dev/tracer/internal/nft/nftgen"
)

// TestDumpGenerated writes the generated 5,000-Service script for timing
// nft itself (TRACER_NFT_GEN=path); it does nothing otherwise.
func TestDumpGenerated(t *testing.T) {
	path := os.Getenv("TRACER_NFT_GEN")
	if path == "" {
		t.Skip("set TRACER_NFT_GEN=FILE to write the generated kube-proxy table")
	}
	script, _, _ := nftgen.KubeProxy(benchServices, benchEndpoints)
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
}
