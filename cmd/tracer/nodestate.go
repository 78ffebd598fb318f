package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/enrich/node"
	"github.com/tracer-dev/tracer/internal/trace"
)

// stateSource is where explain and audit read the node they walk: a
// recorded trace's snapshot, or the node itself, now, with the metadata
// the flags name.
type stateSource struct {
	snapshot   string
	netns      string
	kubeconfig string
	metadata   string
	node       string
}

func (s *stateSource) flags(fs *flag.FlagSet) {
	fs.StringVar(&s.snapshot, "snapshot", "", "walk the node state recorded in trace `FILE` (its header) instead of reading this node")
	fs.StringVar(&s.netns, "netns", "", "read the node state of the network namespace at `PATH` instead of the caller's")
	fs.StringVar(&s.kubeconfig, "kubeconfig", "", "pod and Service metadata from the cluster of this kubeconfig (in a pod: the in-cluster config)")
	fs.StringVar(&s.metadata, "metadata", "", "pod and Service metadata from `FILE`: kubectl get pods,services,endpointslices -A -o json")
	fs.StringVar(&s.node, "node", "", "this node's name (default: the hostname, or the trace's node)")
}

// read returns the node's name, state and metadata, and the environment
// a prediction walks.
func (s *stateSource) read(ctx context.Context) (string, *trace.Snapshot, enrich.Env, error) {
	name, snap, err := s.snap(ctx)
	if err != nil {
		return "", nil, nil, err
	}
	env, err := enrich.NewSnapshotEnv(name, snap)
	if err != nil {
		return "", nil, nil, usagef("node state: %v", err)
	}
	return name, snap, env, nil
}

func (s *stateSource) snap(ctx context.Context) (string, *trace.Snapshot, error) {
	if s.snapshot != "" {
		if s.netns != "" || s.kubeconfig != "" || s.metadata != "" {
			return "", nil, usagef("--snapshot walks the recorded state and metadata: --netns, --kubeconfig and --metadata do not apply")
		}
		tr, err := readTrace(s.snapshot)
		if err != nil {
			return "", nil, err
		}
		if tr.Header.Snapshot == nil {
			return "", nil, usagef("--snapshot %s: the trace's header records no node state", s.snapshot)
		}
		name := tr.Header.Node
		if s.node != "" {
			name = s.node
		}
		return name, tr.Header.Snapshot, nil
	}
	name := s.node
	if name == "" {
		name = hostname()
	}
	snap, err := readNode(ctx, s.netns)
	if err != nil {
		return "", nil, err
	}
	idx, err := openMetadata(ctx, s.kubeconfig, s.metadata, name)
	if err != nil {
		return "", nil, err
	}
	if idx != nil {
		snap.Pods, snap.Services = idx.Snapshot()
	}
	return name, snap, nil
}

// readNode reads the namespace's rules, ipsets, IPVS, addresses and
// listeners once, as a trace header records them.
func readNode(ctx context.Context, netns string) (*trace.Snapshot, error) {
	if netns != "" {
		if _, err := netnsInode(netns); err != nil {
			return nil, usagef("--netns %s: %v", netns, err)
		}
	}
	w, err := node.Watch(ctx, netns)
	if errors.Is(err, os.ErrPermission) {
		return nil, usagef("read the node state: %v (run as root: the rules, ipsets and IPVS need CAP_NET_ADMIN)", err)
	}
	if err != nil {
		return nil, fmt.Errorf("read the node state: %w", err)
	}
	defer w.Close()
	return w.Current().Snapshot(), nil
}
