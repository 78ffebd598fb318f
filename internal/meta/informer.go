package meta

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Options tunes NewFromClient and NewFromKubeconfig.
type Options struct {
	// Retention is how long deleted pods still answer PodByIP
	// (DefaultRetention when zero).
	Retention time.Duration
	// SyncTimeout bounds start-up: after it the index serves what it has
	// and says so in Warnings (DefaultSyncTimeout when zero).
	SyncTimeout time.Duration
	// Now is the clock for deletion times and warnings (time.Now when nil).
	Now func() time.Time

	keepAll bool // tests: cache whole objects, to measure what converting saves
}

// DefaultSyncTimeout is how long start-up waits for the first complete list:
// long enough for a large cluster's pods, short enough that a tracer started
// during an API server outage still traces.
const DefaultSyncTimeout = 10 * time.Second

// quietRecovery is how long without a new list/watch error counts as
// recovered even when nothing changed: the reflector retries at most every
// 60 s (30 s backoff, full jitter), so a still-broken connection errs within.
const quietRecovery = 2 * time.Minute

// maxConvWarnings bounds the warnings kept about objects that could not be
// used; one broken controller should not grow memory without end.
const maxConvWarnings = 20

// Resource names, as the informers and warnings call them.
const (
	kindPods      = "pods"
	kindServices  = "services"
	kindEndpoints = "endpointslices"
)

// clientIndex is a store kept current by informers.
type clientIndex struct {
	*store
	node string

	informers map[string]cache.SharedIndexInformer
	regs      map[string]cache.ResourceEventHandlerRegistration

	conn *connHealth // nil when the clientset was given

	mu        sync.Mutex
	health    map[string]*health
	convWarns []string
	started   time.Time
}

// health is the state of one informer's connection, from its watch error
// handler.
type health struct {
	failing bool
	since   time.Time // first error of the current outage
	last    time.Time // latest error
	err     string
	rv      string // the informer's resource version at the latest error
}

// NewFromClient starts informers for pods, Services and EndpointSlices and
// waits at most opts.SyncTimeout for their first list. node is this node's
// name: its pods keep their container IDs, other nodes' pods drop them. The
// informers run until ctx is done; the index keeps its last state
// when the API server goes away.
func NewFromClient(ctx context.Context, cs kubernetes.Interface, node string, opts Options) (Index, error) {
	return newClientIndex(ctx, cs, node, opts, nil)
}

func newClientIndex(ctx context.Context, cs kubernetes.Interface, node string, opts Options, conn *connHealth) (Index, error) {
	if opts.SyncTimeout <= 0 {
		opts.SyncTimeout = DefaultSyncTimeout
	}
	st := newStore(opts.Retention, opts.Now)
	ci := &clientIndex{
		store:     st,
		node:      node,
		informers: map[string]cache.SharedIndexInformer{},
		regs:      map[string]cache.ResourceEventHandlerRegistration{},
		health:    map[string]*health{},
		started:   st.now(),
		conn:      conn,
	}
	// No resync: the index changes only with the cluster, and a resync
	// would redo every conversion.
	var fopts []informers.SharedInformerOption
	if !opts.keepAll {
		fopts = append(fopts, informers.WithTransform(stripper(node)))
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, fopts...)
	ci.informers[kindPods] = factory.Core().V1().Pods().Informer()
	ci.informers[kindServices] = factory.Core().V1().Services().Informer()
	ci.informers[kindEndpoints] = factory.Discovery().V1().EndpointSlices().Informer()

	handlers := map[string]cache.ResourceEventHandler{
		kindPods: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { ci.onPod(obj) },
			UpdateFunc: func(old, obj any) { ci.onPod(obj) },
			DeleteFunc: func(obj any) { ci.onDelete(obj, st.deletePod) },
		},
		kindServices: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { ci.onService(obj) },
			UpdateFunc: func(old, obj any) { ci.onService(obj) },
			DeleteFunc: func(obj any) { ci.onDelete(obj, st.deleteService) },
		},
		kindEndpoints: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { ci.onSlice(obj) },
			UpdateFunc: func(old, obj any) { ci.onSlice(obj) },
			DeleteFunc: func(obj any) {
				ci.onDelete(obj, func(ns, name string) { st.deleteSlice(ns + "/" + name) })
			},
		},
	}
	for kind, inf := range ci.informers {
		if err := inf.SetWatchErrorHandler(ci.watchErrorHandler(kind)); err != nil {
			return nil, fmt.Errorf("set %s watch error handler: %w", kind, err)
		}
		reg, err := inf.AddEventHandler(handlers[kind])
		if err != nil {
			return nil, fmt.Errorf("add %s event handler: %w", kind, err)
		}
		ci.regs[kind] = reg
	}
	factory.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		factory.Shutdown()
	}()

	wctx, cancel := context.WithTimeout(ctx, opts.SyncTimeout)
	defer cancel()
	var synced []cache.InformerSynced
	for _, r := range ci.regs {
		synced = append(synced, r.HasSynced)
	}
	if !cache.WaitForCacheSync(wctx.Done(), synced...) && ctx.Err() != nil {
		return nil, fmt.Errorf("wait for metadata: %w", ctx.Err())
	}
	// After the deadline the index runs unsynced: Synced and Warnings say so.
	return ci, nil
}

func (ci *clientIndex) watchErrorHandler(kind string) cache.WatchErrorHandler {
	return func(r *cache.Reflector, err error) {
		// A watch that ends or whose resource version expired is routine:
		// the reflector re-lists without the metadata going stale.
		if errors.Is(err, io.EOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return
		}
		now := ci.now()
		rv := ci.informers[kind].LastSyncResourceVersion()
		ci.mu.Lock()
		defer ci.mu.Unlock()
		h := ci.health[kind]
		if h == nil {
			h = &health{}
			ci.health[kind] = h
		}
		if !h.failing || ci.recoveredLocked(kind, h, now) {
			h.since = now
		}
		h.failing, h.last, h.err, h.rv = true, now, err.Error(), rv
	}
}

// recoveredLocked reports whether an informer that failed works again: its
// resource version moved (a list or watch event succeeded since), or no error
// came for longer than the reflector's retry interval.
func (ci *clientIndex) recoveredLocked(kind string, h *health, now time.Time) bool {
	return ci.informers[kind].LastSyncResourceVersion() != h.rv || now.Sub(h.last) > quietRecovery
}

// Synced implements Index.
func (ci *clientIndex) Synced() bool {
	for _, r := range ci.regs {
		if !r.HasSynced() {
			return false
		}
	}
	return true
}

// Warnings implements Index.
func (ci *clientIndex) Warnings() []string {
	now := ci.now()
	ci.mu.Lock()
	defer ci.mu.Unlock()
	var out, failing []string
	var since time.Time
	for _, kind := range []string{kindPods, kindServices, kindEndpoints} {
		h := ci.health[kind]
		if h == nil || !h.failing {
			continue
		}
		if ci.recoveredLocked(kind, h, now) {
			h.failing = false
			continue
		}
		if since.IsZero() || h.since.Before(since) {
			since = h.since
		}
		failing = append(failing, kind+": "+h.err)
	}
	if ci.conn != nil {
		if s, err, bad := ci.conn.state(); bad {
			if since.IsZero() || s.Before(since) {
				since = s
			}
			failing = append([]string{err}, failing...)
		}
	}
	if len(failing) > 0 {
		out = append(out, fmt.Sprintf("API server unreachable since %s: metadata may be stale (%s)",
			since.Format("15:04:05"), strings.Join(failing, "; ")))
	}
	var unsynced []string
	for _, kind := range []string{kindPods, kindServices, kindEndpoints} {
		if !ci.regs[kind].HasSynced() {
			unsynced = append(unsynced, kind)
		}
	}
	if len(unsynced) > 0 {
		out = append(out, fmt.Sprintf("metadata incomplete: %s not listed since %s; pods and Services may be missing",
			strings.Join(unsynced, ", "), ci.started.Format("15:04:05")))
	}
	return append(out, ci.convWarns...)
}

func (ci *clientIndex) warnLocked(msg string) {
	if len(ci.convWarns) < maxConvWarnings && !slices.Contains(ci.convWarns, msg) {
		ci.convWarns = append(ci.convWarns, msg)
	}
}

func (ci *clientIndex) skip(kind string, m metav1.Object, err error) {
	ci.mu.Lock()
	defer ci.mu.Unlock()
	ci.warnLocked(fmt.Sprintf("%s %s/%s ignored: %v", kind, m.GetNamespace(), m.GetName(), err))
}

func (ci *clientIndex) onPod(obj any) {
	c := cachedOf(obj, ci.node)
	switch {
	case c == nil:
	case c.err != nil:
		ci.skip("pod", c, c.err)
	default:
		ci.upsertPod(c.pod)
	}
}

func (ci *clientIndex) onService(obj any) {
	c := cachedOf(obj, ci.node)
	switch {
	case c == nil:
	case c.err != nil:
		ci.skip("service", c, c.err)
	default:
		ci.upsertService(c.svc)
	}
}

func (ci *clientIndex) onSlice(obj any) {
	c := cachedOf(obj, ci.node)
	switch {
	case c == nil:
	case c.err != nil:
		ci.skip("endpointslice", c, c.err)
	case c.slice == nil:
		// Relabelled away from its Service: forget what it said.
		ci.deleteSlice(c.Namespace + "/" + c.Name)
	default:
		ci.upsertSlice(c.slice)
	}
}

// onDelete accepts the object or, when the deletion happened while the watch
// was down, the informer's DeletedFinalStateUnknown.
func (ci *clientIndex) onDelete(obj any, del func(namespace, name string)) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if m, ok := obj.(metav1.Object); ok {
		del(m.GetNamespace(), m.GetName())
	}
}

// cached is what the informers store instead of an API object: the identity
// the informer keys and versions it by, and the index's own converted form,
// which the index then shares. A stripped corev1.Pod would still be a
// 1.2 kB struct; this is the PodInfo the index needs anyway plus the
// identity.
type cached struct {
	metav1.ObjectMeta
	pod   *PodInfo
	svc   *ServiceInfo
	slice *sliceInfo // nil for a slice of no Service
	err   error      // the object could not be converted; reported, not indexed
}

// GetObjectKind implements runtime.Object.
func (*cached) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object. The converted forms are never
// modified, so they are shared.
func (c *cached) DeepCopyObject() runtime.Object {
	cp := *c
	c.ObjectMeta.DeepCopyInto(&cp.ObjectMeta)
	return &cp
}

// identity keeps what the informer needs of an object's metadata: its key
// and its resource version.
func identity(m *metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion}
}

// stripper returns the informers' transform: it converts an object into
// what the index reads before the object is cached, so that a large
// cluster's pods cost a few hundred bytes each instead of kilobytes. Pods of
// other nodes lose their container IDs (rules on this node never name them).
// It is idempotent, as informers require. Conversion errors travel in the
// result: a transform error would break the informer's watch.
func stripper(node string) cache.TransformFunc {
	return func(obj any) (any, error) {
		if c := cachedOf(obj, node); c != nil {
			return c, nil
		}
		return obj, nil
	}
}

// cachedOf converts an API object (or returns an already converted one); nil
// for objects of other types.
func cachedOf(obj any, node string) *cached {
	switch o := obj.(type) {
	case *cached:
		return o
	case *corev1.Pod:
		c := &cached{ObjectMeta: identity(&o.ObjectMeta)}
		c.pod, c.err = podInfo(o)
		if c.err == nil && node != "" && o.Spec.NodeName != node {
			c.pod.ContainerIDs = nil
		}
		return c
	case *corev1.Service:
		c := &cached{ObjectMeta: identity(&o.ObjectMeta)}
		c.svc, c.err = serviceInfo(o)
		return c
	case *discoveryv1.EndpointSlice:
		c := &cached{ObjectMeta: identity(&o.ObjectMeta)}
		c.slice, c.err = sliceInfoOf(o)
		return c
	}
	return nil
}
