package live

import (
	"reflect"
	"slices"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// recordedMetadata is the pods and Services the trace holds so far: the
// header's, then each delta written.
type recordedMetadata struct {
	pods     map[trace.ObjectRef]trace.Pod
	services map[trace.ObjectRef]trace.Service
}

func newRecordedMetadata(pods []trace.Pod, services []trace.Service) recordedMetadata {
	r := recordedMetadata{pods: make(map[trace.ObjectRef]trace.Pod, len(pods)), services: make(map[trace.ObjectRef]trace.Service, len(services))}
	for _, p := range pods {
		r.pods[p.Ref()] = p
	}
	for _, s := range services {
		r.services[s.Ref()] = s
	}
	return r
}

// since is what a trace holding r must record to hold pods and services
// instead (every object, less what r holds as it is, and those r holds
// that are gone), applied to r; nil when nothing differs.
func (r recordedMetadata) since(pods []trace.Pod, services []trace.Service) *trace.MetadataChange {
	return r.take(&trace.MetadataChange{Pods: pods, Services: services,
		PodsGone:     missing(r.pods, pods, func(p trace.Pod) trace.ObjectRef { return p.Ref() }),
		ServicesGone: missing(r.services, services, func(s trace.Service) trace.ObjectRef { return s.Ref() })})
}

// missing lists, sorted, the objects held that cur no longer has.
func missing[T any](held map[trace.ObjectRef]T, cur []T, key func(T) trace.ObjectRef) []trace.ObjectRef {
	have := make(map[trace.ObjectRef]bool, len(cur))
	for _, o := range cur {
		have[key(o)] = true
	}
	var gone []trace.ObjectRef
	for k := range held {
		if !have[k] {
			gone = append(gone, k)
		}
	}
	slices.SortFunc(gone, trace.ObjectRef.Compare)
	return gone
}

// take keeps of d what r does not already hold, and applies it to r; nil
// when r held all of it (a resync, or a change the header already had).
func (r recordedMetadata) take(d *trace.MetadataChange) *trace.MetadataChange {
	out := &trace.MetadataChange{}
	out.Pods, out.PodsGone = takeObjects(r.pods, d.Pods, d.PodsGone, func(p trace.Pod) trace.ObjectRef { return p.Ref() })
	out.Services, out.ServicesGone = takeObjects(r.services, d.Services, d.ServicesGone, func(s trace.Service) trace.ObjectRef { return s.Ref() })
	if len(out.Pods)+len(out.PodsGone)+len(out.Services)+len(out.ServicesGone) == 0 {
		return nil
	}
	return out
}

func takeObjects[T any](held map[trace.ObjectRef]T, changed []T, gone []trace.ObjectRef, key func(T) trace.ObjectRef) (newer []T, left []trace.ObjectRef) {
	for _, k := range gone {
		if _, ok := held[k]; ok {
			delete(held, k)
			left = append(left, k)
		}
	}
	for _, o := range changed {
		if was, ok := held[key(o)]; !ok || !reflect.DeepEqual(was, o) {
			held[key(o)] = o
			newer = append(newer, o)
		}
	}
	return newer, left
}

// pendingMetadata is a change the index told of, not yet recorded.
type pendingMetadata struct {
	at time.Time
	d  *trace.MetadataChange
}

// metadataChanged is the index's OnChange: it runs under the index's
// lock, so it only queues the change, while the trace is recorded, and
// wakes the watch.
func (s *states) metadataChanged(at time.Time, d *trace.MetadataChange) {
	s.pendMu.Lock()
	if s.recording {
		s.pending = append(s.pending, pendingMetadata{at, d})
	}
	s.pendMu.Unlock()
	select {
	case s.metaWake <- struct{}{}:
	default:
	}
}

// watchMetadata records each change the index tells of, at the time the
// index took it, until stop closes.
func (s *states) watchMetadata(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-s.metaWake:
			s.recordMetadata()
		}
	}
}

// recordMetadata writes the queued changes, each as a state line, less
// what the trace already holds.
func (s *states) recordMetadata() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writePendingLocked()
}

// writePendingLocked takes the queue and writes it. The caller holds mu,
// so the sink cannot go while a taken batch is written.
func (s *states) writePendingLocked() {
	s.pendMu.Lock()
	queued := s.pending
	s.pending = nil
	s.pendMu.Unlock()
	if s.sink == nil || s.recordedMeta.pods == nil {
		return
	}
	for _, p := range queued {
		if !p.at.After(s.metaSince) {
			continue // already in the line written when recording began
		}
		if d := s.recordedMeta.take(p.d); d != nil {
			s.sink(&trace.StateChange{Type: trace.TypeState, Time: p.at.UTC(), Changed: []string{trace.PartMetadata}, Metadata: d})
		}
	}
}
