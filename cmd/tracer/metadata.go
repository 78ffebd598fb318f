package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

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
	cfg.MetadataSnapshot = idx.Snapshot
	cfg.MetadataWarnings = idx.Warnings
	return nil
}

func openMetadata(ctx context.Context, kubeconfig, file, node string) (meta.Index, error) {
	switch {
	case file != "":
		idx, err := meta.LoadFile(file)
		if err != nil {
			return nil, usagef("--metadata: %v", err)
		}
		return idx, nil
	case kubeconfig != "":
		rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, usagef("--kubeconfig %s: %v", kubeconfig, err)
		}
		return fromCluster(ctx, rc, node)
	case os.Getenv("KUBERNETES_SERVICE_HOST") != "":
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config: %w", err)
		}
		return fromCluster(ctx, rc, node)
	}
	return nil, nil
}

func fromCluster(ctx context.Context, rc *rest.Config, node string) (meta.Index, error) {
	rc.UserAgent = "tracer"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, usagef("kubernetes client: %v", err)
	}
	return meta.NewFromClient(ctx, cs, node, meta.Options{})
}
