package live

import (
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/trace"
)

// moduleHooks are the hooks whose functions live in a module that may be
// loaded, unloaded and loaded again under a running tracer (kube-proxy
// loads ip_vs when it starts in IPVS mode; an operator may unload it).
var moduleHooks = map[string][]event.Hook{"ip_vs": {event.HookIPVSConnNew, event.HookIPVSLeave}}

// moduleState is what the tracer last saw of a module: loaded, and the
// inode of its /sys/module directory, which a new load of the module gets
// anew, so an unload and load between two looks is still seen.
type moduleState struct {
	name   string
	loaded bool
	ino    uint64
}

func readModule(name string) moduleState {
	m := moduleState{name: name}
	b, err := os.ReadFile("/sys/module/" + name + "/initstate")
	if err != nil || strings.TrimSpace(string(b)) != "live" {
		return m
	}
	var st unix.Stat_t
	if err := unix.Stat("/sys/module/"+name, &st); err != nil {
		return m
	}
	m.loaded, m.ino = true, st.Ino
	return m
}

func (p *Pipeline) watchModulesFromNow() {
	for name := range moduleHooks {
		p.modules = append(p.modules, readModule(name))
	}
}

// watchModules looks at the modules again; for each that went away it
// records its hooks as lost, and for each that is loaded anew it walks
// their ladders again.
func (p *Pipeline) watchModules(now time.Time, sum *trace.Summary) {
	for i, was := range p.modules {
		cur := readModule(was.name)
		if cur == was {
			continue
		}
		p.modules[i] = cur
		for _, h := range moduleHooks[cur.name] {
			c := p.moduleChange(now, h, was, cur)
			sum.HookChanges = append(sum.HookChanges, c)
			if p.cfg.OnHookChange != nil {
				p.cfg.OnHookChange(c)
			}
		}
	}
}

func (p *Pipeline) moduleChange(now time.Time, h event.Hook, was, cur moduleState) trace.HookChange {
	c := trace.HookChange{Time: now.UTC(), Hook: h.String(), Module: cur.name}
	if !cur.loaded {
		c.Why = fmt.Sprintf("%s was unloaded: its decisions are not seen until it is loaded again", cur.name)
		return c
	}
	hp, err := p.tracer.Reattach(h)
	if hp.Via != event.ViaNone {
		c.Via = hp.Via.String()
	}
	switch {
	case err != nil:
		c.Why = err.Error()
	case hp.Via == event.ViaNone:
		c.Why = fmt.Sprintf("%s was loaded, but its hook did not attach: %s", cur.name, hp.Summary())
	case was.loaded:
		c.Why = fmt.Sprintf("%s was unloaded and loaded again: attached anew", cur.name)
	default:
		c.Why = fmt.Sprintf("%s was loaded: attached", cur.name)
	}
	return c
}
