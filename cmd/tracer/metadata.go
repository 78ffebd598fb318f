package main

import (
	"context"
	"errors"
	"io"
	"os"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/live"
	"github.com/tracer-dev/tracer/internal/meta"
)

// attachMetadata opens the pod and Service metadata the flags ask for: a
// kubectl JSON file, a kubeconfig, or in a pod the in-cluster config. A
// file or kubeconfig that cannot be read is bad input (exit 2); an API
// server that cannot be reached is a warning, and tracing goes on.
func attachMetadata(ctx context.Context, cfg *live.Config, kubeconfig, file string, stderr io.Writer) error {
	idx, err := openMetadata(ctx, kubeconfig, file, cfg.NodeName)
	if err != nil || idx == nil {
		return err
	}
	cfg.Metadata = enrich.NewIndexMetadata(idx)
	cfg.MetadataSnapshot, cfg.MetadataOnChange = idx.Snapshot, idx.OnChange
	cfg.MetadataWarnings = idx.Warnings
	return nil
}

func openMetadata(ctx context.Context, kubeconfig, file, node string) (meta.Index, error) {
	if file != "" {
		idx, err := meta.LoadFile(file)
		if err != nil {
			return nil, usagef("--metadata: %v", err)
		}
		return idx, nil
	}
	if kubeconfig == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return nil, nil // no cluster to ask: flows name no pods
	}
	idx, err := meta.NewFromKubeconfig(ctx, kubeconfig, node)
	switch {
	case errors.Is(err, meta.ErrNoConfig):
		return nil, nil
	case err != nil:
		return nil, usagef("--kubeconfig: %v", err)
	}
	return idx, nil
}
