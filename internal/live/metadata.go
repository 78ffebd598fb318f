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

// delta is what a trace holding r must record to hold pods and services
// instead, nil when they are the same, and the state it then holds.
func (r recordedMetadata) delta(pods []trace.Pod, services []trace.Service) (*trace.MetadataChange, recordedMetadata) {
	next := newRecordedMetadata(pods, services)
	d := &trace.MetadataChange{}
	d.Pods, d.PodsGone = diffObjects(r.pods, next.pods, pods, func(p trace.Pod) trace.ObjectRef { return p.Ref() })
	d.Services, d.ServicesGone = diffObjects(r.services, next.services, services, func(s trace.Service) trace.ObjectRef { return s.Ref() })
	if len(d.Pods)+len(d.PodsGone)+len(d.Services)+len(d.ServicesGone) == 0 {
		return nil, r
	}
	return d, next
}

// diffObjects lists, in cur's order, the objects new or changed since old,
// and, sorted, those gone.
func diffObjects[T any](old, next map[trace.ObjectRef]T, cur []T, key func(T) trace.ObjectRef) (changed []T, gone []trace.ObjectRef) {
	for _, o := range cur {
		if was, ok := old[key(o)]; !ok || !reflect.DeepEqual(was, o) {
			changed = append(changed, o)
		}
	}
	for k := range old {
		if _, ok := next[k]; !ok {
			gone = append(gone, k)
		}
	}
	slices.SortFunc(gone, trace.ObjectRef.Compare)
	return changed, gone
}

// metadataSettle lets a burst of changes (a rollout, a namespace deleted)
// settle into one delta; metadataPoll catches what changes without a
// notice (a deleted pod's retention ending).
const (
	metadataSettle = 100 * time.Millisecond
	metadataPoll   = 10 * time.Second
)

// metadataChanged is the index's OnChange: it runs under the index's
// lock, so it only notes the time and wakes the watch.
func (s *states) metadataChanged(at time.Time) {
	s.pendMu.Lock()
	if s.pendingSince.IsZero() {
		s.pendingSince = at
	}
	s.pendMu.Unlock()
	select {
	case s.metaWake <- struct{}{}:
	default:
	}
}

// watchMetadata writes a metadata delta whenever the pods or Services
// differ from what the trace holds, until stop closes.
func (s *states) watchMetadata(stop <-chan struct{}) {
	t := time.NewTicker(metadataPoll)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		case <-s.metaWake:
			select {
			case <-stop:
				return
			case <-time.After(metadataSettle):
			}
		}
		s.recordMetadata()
	}
}

// recordMetadata writes the delta from the metadata the trace holds to
// the index's now, stamped with when the index took its first change.
func (s *states) recordMetadata() {
	s.pendMu.Lock()
	at := s.pendingSince
	s.pendingSince = time.Time{}
	s.pendMu.Unlock()
	if at.IsZero() {
		at = time.Now()
	}
	pods, services := s.metadata() // outside mu: it takes the index's lock
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sink == nil || s.recordedMeta.pods == nil {
		return
	}
	d, next := s.recordedMeta.delta(pods, services)
	if d == nil {
		return
	}
	s.recordedMeta = next
	s.sink(&trace.StateChange{Type: trace.TypeState, Time: at.UTC(), Changed: []string{trace.PartMetadata}, Metadata: d})
}
