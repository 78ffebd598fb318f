package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/term"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/tracer-dev/tracer/internal/agent"
	"github.com/tracer-dev/tracer/internal/audit"
	"github.com/tracer-dev/tracer/internal/meta"
	"github.com/tracer-dev/tracer/internal/trace"
)

// kubectlName is the name kubectl finds a plugin by: the same binary,
// installed (or linked) as kubectl-tracer, is `kubectl tracer`.
const kubectlName = "kubectl-tracer"

// agentLabel and agentPort are deploy/agent.yaml's.
const (
	agentLabel = "app.kubernetes.io/name=tracer-agent"
	agentPort  = 4245
)

func init() {
	commands["kubectl"] = command{
		summary: "kubectl tracer [trace|doctor|audit]: the cluster's agents through the API server (installed as kubectl-tracer)",
		run:     runKubectl,
	}
}

type kubectlOptions struct {
	connect    connectOptions
	kubeconfig string
	context    string
	namespace  string
	nodes      string
	allNodes   bool
	selector   string
}

func runKubectl(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub := "trace"
	if len(args) > 0 && (args[0] == "trace" || args[0] == "doctor" || args[0] == "audit") {
		sub, args = args[0], args[1:]
	}
	var o kubectlOptions
	fs := newFlagSet("kubectl "+sub, stderr)
	o.connect.registerOutput(fs)
	if term.IsTerminal(int(os.Stdout.Fd())) && term.IsTerminal(int(os.Stdin.Fd())) && sub == "trace" {
		// On a terminal kubectl tracer is the UI, as tracer is.
		fs.Lookup("o").DefValue, o.connect.output = "ui", "ui"
	}
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig `PATH` (default: $KUBECONFIG, ~/.kube/config)")
	fs.StringVar(&o.context, "context", "", "kubeconfig context (default: the current one)")
	fs.StringVar(&o.namespace, "namespace", "tracer", "the agents' namespace (deploy/agent.yaml's)")
	fs.StringVar(&o.nodes, "node", "", "follow the agents of these nodes, comma separated")
	fs.BoolVar(&o.allNodes, "all-nodes", false, "follow the agents of every node")
	fs.StringVar(&o.selector, "l", "", "follow the agents of the nodes this label `SELECTOR` picks (needs list nodes: deploy/user-rbac.yaml)")
	if sub == "trace" {
		o.connect.registerStream(fs)
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := o.validate(sub); err != nil {
		return err
	}
	// client-go's port-forwarder logs each broken copy to stderr, which
	// tears the UI; a broken forward shows as its node's stream ending.
	meta.SilenceClientLogs()
	cs, cfg, err := o.client()
	if err != nil {
		return err
	}
	pods, err := o.agentPods(ctx, cs)
	if err != nil {
		return err
	}
	fwd := &forwards{cfg: cfg}
	defer fwd.close()
	targets := fwd.open(ctx, pods)
	switch sub {
	case "doctor":
		return kubectlDoctor(ctx, targets, stdout)
	case "audit":
		return kubectlAudit(ctx, targets, o.connect.output, stdout)
	}
	if o.connect.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.connect.duration)
		defer cancel()
	}
	return newMerge(o.connect, targets, stdout, stderr).run(ctx, "kubectl tracer")
}

func (o kubectlOptions) validate(sub string) error {
	picks := 0
	for _, set := range []bool{o.nodes != "", o.allNodes, o.selector != ""} {
		if set {
			picks++
		}
	}
	if picks != 1 {
		return usagef("name the nodes: one of --node NAME[,NAME], --all-nodes or -l SELECTOR")
	}
	if sub == "doctor" || sub == "audit" {
		if o.connect.output != "text" && o.connect.output != "json" {
			return usagef("-o %q: want text or json", o.connect.output)
		}
		return nil
	}
	return o.connect.validateFlags()
}

// client is the API server of the kubeconfig, as kubectl would pick it.
func (o kubectlOptions) client() (kubernetes.Interface, *rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if o.kubeconfig != "" {
		rules.ExplicitPath = o.kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.context}).ClientConfig()
	if err != nil {
		return nil, nil, usagef("--kubeconfig: %v", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, usagef("--kubeconfig: %v", err)
	}
	return cs, cfg, nil
}

// agentPods are the agent pods of the nodes asked for, one per node, in
// node order. A node asked for by name without an agent pod is an error.
func (o kubectlOptions) agentPods(ctx context.Context, cs kubernetes.Interface) ([]corev1.Pod, error) {
	list, err := cs.CoreV1().Pods(o.namespace).List(ctx, metav1.ListOptions{LabelSelector: agentLabel})
	if err != nil {
		return nil, rbacHint(fmt.Errorf("list the agent pods in namespace %s: %w", o.namespace, err))
	}
	byNode := map[string]corev1.Pod{}
	for _, p := range list.Items {
		if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
			byNode[p.Spec.NodeName] = p
		}
	}
	want, err := o.wantedNodes(ctx, cs, byNode)
	if err != nil {
		return nil, err
	}
	var pods []corev1.Pod
	var missing []string
	for _, n := range want {
		p, ok := byNode[n]
		if !ok {
			missing = append(missing, n)
			continue
		}
		pods = append(pods, p)
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("no agent pod (%s in namespace %s) on node %s: is deploy/agent.yaml applied, and does the DaemonSet run there?",
			agentLabel, o.namespace, strings.Join(missing, ", "))
	}
	if len(pods) == 0 {
		return nil, fmt.Errorf("no agent pod (%s) in namespace %s: apply deploy/agent.yaml", agentLabel, o.namespace)
	}
	return pods, nil
}

func (o kubectlOptions) wantedNodes(ctx context.Context, cs kubernetes.Interface, byNode map[string]corev1.Pod) ([]string, error) {
	var want []string
	switch {
	case o.allNodes:
		for n := range byNode {
			want = append(want, n)
		}
	case o.nodes != "":
		for _, n := range strings.Split(o.nodes, ",") {
			if n = strings.TrimSpace(n); n != "" && !slices.Contains(want, n) {
				want = append(want, n)
			}
		}
	default:
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: o.selector})
		if apierrors.IsBadRequest(err) {
			return nil, usagef("-l %q: %v", o.selector, err)
		}
		if err != nil {
			return nil, rbacHint(fmt.Errorf("list the nodes of -l %s: %w", o.selector, err))
		}
		for _, n := range nodes.Items {
			want = append(want, n.Name)
		}
		if len(want) == 0 {
			return nil, fmt.Errorf("-l %s picks no node", o.selector)
		}
	}
	slices.Sort(want)
	return want, nil
}

// rbacHint says what to grant when the API server refused.
func rbacHint(err error) error {
	if apierrors.IsForbidden(err) || strings.Contains(err.Error(), "forbidden") {
		return fmt.Errorf("%w\nkubectl tracer needs get and list on pods and create on pods/portforward in the agents' namespace, and list on nodes for -l: deploy/user-rbac.yaml grants them to the group tracer-users", err)
	}
	if apierrors.IsUnauthorized(err) {
		return fmt.Errorf("%w\nthe API server did not accept these credentials: check --kubeconfig and --context", err)
	}
	return err
}

// forwards are the port-forwards to the agent pods, through the API
// server, each to a loopback port of this machine.
type forwards struct {
	cfg   *rest.Config
	stops []chan struct{}
}

// open starts a port-forward to every pod's agent port. A pod whose
// forward fails becomes a target that failed with that error: that node
// is an error, the others go on.
func (f *forwards) open(ctx context.Context, pods []corev1.Pod) []mergeTarget {
	targets := make([]mergeTarget, len(pods))
	for i, p := range pods {
		t := mergeTarget{name: "pod " + p.Namespace + "/" + p.Name, node: p.Spec.NodeName}
		if p.Status.Phase != corev1.PodRunning {
			t.err = fmt.Errorf("agent pod %s/%s is %s, not Running", p.Namespace, p.Name, orDash(string(p.Status.Phase)))
		} else {
			t.addr, t.err = f.forward(ctx, p)
		}
		targets[i] = t
	}
	return targets
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// forward opens one port-forward, as kubectl port-forward does, and
// returns the loopback address it listens on.
func (f *forwards) forward(ctx context.Context, p corev1.Pod) (string, error) {
	transport, upgrader, err := spdy.RoundTripperFor(f.cfg)
	if err != nil {
		return "", fmt.Errorf("port-forward to %s/%s: %w", p.Namespace, p.Name, err)
	}
	u, err := url.Parse(f.cfg.Host)
	if err != nil {
		return "", fmt.Errorf("port-forward to %s/%s: %w", p.Namespace, p.Name, err)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + fmt.Sprintf("/api/v1/namespaces/%s/pods/%s/portforward", p.Namespace, p.Name)
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	stop, ready := make(chan struct{}), make(chan struct{})
	// What goes wrong later shows as the agent's stream breaking.
	pf, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", agentPort)}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		return "", fmt.Errorf("port-forward to %s/%s: %w", p.Namespace, p.Name, err)
	}
	failed := make(chan error, 1)
	go func() { failed <- pf.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-failed:
		return "", rbacHint(fmt.Errorf("port-forward to %s/%s: %w", p.Namespace, p.Name, err))
	case <-ctx.Done():
		close(stop)
		return "", ctx.Err()
	case <-time.After(30 * time.Second):
		close(stop)
		return "", fmt.Errorf("port-forward to %s/%s: not ready after 30s", p.Namespace, p.Name)
	}
	f.stops = append(f.stops, stop)
	ports, err := pf.GetPorts()
	if err != nil || len(ports) != 1 {
		return "", fmt.Errorf("port-forward to %s/%s: no local port (%v)", p.Namespace, p.Name, err)
	}
	return fmt.Sprintf("127.0.0.1:%d", ports[0].Local), nil
}

func (f *forwards) close() {
	for _, s := range f.stops {
		close(s)
	}
}

// kubectlDoctor asks each agent for its header and prints each node's
// kernel, hook plan and warnings.
func kubectlDoctor(ctx context.Context, targets []mergeTarget, stdout io.Writer) error {
	var failed []string
	for _, t := range targets {
		var h trace.Header
		err := withAgent(t, func(c *agent.Client) (err error) {
			h, err = c.Header(ctx)
			return err
		})
		if err != nil {
			fmt.Fprintf(stdout, "node %s (%s): %v\n", t.node, t.name, err)
			failed = append(failed, t.node)
			continue
		}
		fmt.Fprintf(stdout, "node %s (%s): kernel %s\n", t.node, t.name, h.Kernel)
		for _, hk := range h.Hooks {
			fmt.Fprintf(stdout, "  %-24s %-10s %s\n", hk.Hook, hk.Via, hk.Error)
		}
		for _, w := range h.Warnings {
			fmt.Fprintf(stdout, "  warning: %s\n", w)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d agents failed: %s", len(failed), len(targets), strings.Join(failed, ", "))
	}
	return nil
}

// withAgent calls fn with a connection to t's agent, or says why there is
// none. The client bounds each call (agent.DefaultSilence).
func withAgent(t mergeTarget, fn func(*agent.Client) error) error {
	if t.err != nil {
		return t.err
	}
	c, err := agent.Dial(t.addr)
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(c)
}

// asKubectlPlugin: run as kubectl-tracer, the binary is `kubectl tracer`.
func asKubectlPlugin(args []string) []string {
	if filepath.Base(os.Args[0]) == kubectlName {
		return append([]string{"kubectl"}, args...)
	}
	return args
}

// nodeAudit is one node's audit in `kubectl tracer audit -o json`.
type nodeAudit struct {
	Node   string        `json:"node"`
	Agent  string        `json:"agent"`
	Report *audit.Report `json:"report,omitempty"`
	Error  string        `json:"error,omitempty"`
}

// kubectlAudit asks every agent to audit its node, as `tracer audit`
// would there, and says which nodes have problems: exit 1 when any has
// one, or when an agent could not be asked.
func kubectlAudit(ctx context.Context, targets []mergeTarget, output string, stdout io.Writer) error {
	var all []nodeAudit
	var problems, failed []string
	for _, t := range targets {
		na := nodeAudit{Node: t.node, Agent: t.name}
		var r audit.Report
		err := withAgent(t, func(c *agent.Client) (err error) {
			r, err = c.Audit(ctx)
			return err
		})
		if err != nil {
			na.Error = err.Error()
			failed = append(failed, t.node)
		} else {
			na.Report = &r
			if r.Problems() > 0 {
				problems = append(problems, fmt.Sprintf("%s (%d)", t.node, r.Problems()))
			}
		}
		all = append(all, na)
	}
	if output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(all); err != nil {
			return fmt.Errorf("write the audits: %w", err)
		}
	} else {
		for i, na := range all {
			if i > 0 {
				fmt.Fprintln(stdout)
			}
			if na.Report == nil {
				fmt.Fprintf(stdout, "node %s (%s): %s\n", na.Node, na.Agent, na.Error)
				continue
			}
			writeAuditText(stdout, *na.Report)
		}
	}
	var errs []error
	if len(failed) > 0 {
		errs = append(errs, fmt.Errorf("%d of %d agents could not be asked: %s", len(failed), len(targets), strings.Join(failed, ", ")))
	}
	if len(problems) > 0 {
		errs = append(errs, fmt.Errorf("audit: problems on %s", strings.Join(problems, ", ")))
	}
	return errors.Join(errs...)
}
