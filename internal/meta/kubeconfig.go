package meta

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// ErrNoConfig is returned by NewFromKubeconfig when no kubeconfig was given
// and the tracer does not run in a pod.
var ErrNoConfig = errors.New("no kubeconfig given and not running in a pod (KUBERNETES_SERVICE_HOST unset)")

// dialTimeout makes an unreachable API server show up as a warning within
// start-up's sync timeout, instead of after the default 30 s.
const dialTimeout = 5 * time.Second

// NewFromKubeconfig builds a client from the kubeconfig at path, or from the
// in-cluster config when path is "" and the tracer runs in a pod, and starts
// an informer index on it (see NewFromClient). A kubeconfig that cannot be
// read or used is an error naming the file (bad input); an API server that
// cannot be reached is not: the index starts empty and says so in Warnings.
func NewFromKubeconfig(ctx context.Context, path, node string, opts ...Options) (Index, error) {
	cfg, err := restConfig(path)
	if err != nil {
		return nil, err
	}
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	conn := newConnHealth(o.Now)
	cfg.Wrap(conn.wrap)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", cfg.Host, err)
	}
	return newClientIndex(ctx, cs, node, o, conn)
}

func restConfig(path string) (*rest.Config, error) {
	var cfg *rest.Config
	switch {
	case path != "":
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read kubeconfig: %w", err)
		}
		kc, err := clientcmd.Load(data)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		// Relative certificate paths in a kubeconfig are relative to it, as
		// kubectl reads them.
		for _, a := range kc.AuthInfos {
			a.LocationOfOrigin = path
		}
		for _, c := range kc.Clusters {
			c.LocationOfOrigin = path
		}
		if err := clientcmd.ResolveLocalPaths(kc); err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		cfg, err = clientcmd.NewDefaultClientConfig(*kc, &clientcmd.ConfigOverrides{}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
	case os.Getenv("KUBERNETES_SERVICE_HOST") != "":
		var err error
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("in-cluster config: %w", err)
		}
	default:
		return nil, ErrNoConfig
	}
	cfg.UserAgent = "tracer"
	// Protobuf halves the bytes and the decoding garbage of the initial
	// lists on a large cluster.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.Dial = (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext
	return cfg, nil
}

// SilenceClientLogs stops client-go from logging to stderr (for example
// "Warning: watch ended with error" during an API server outage), which
// would tear a terminal UI. The index reports the same conditions through
// Warnings. It changes process-wide state: call it from main.
func SilenceClientLogs() {
	klog.SetLogger(logr.Discard())
}
