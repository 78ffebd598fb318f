package main

import (
	"time"
)

// programCost is the tracer's programs over every round with the kernel's
// BPF statistics on: what each program ran, summed over those rounds, and
// the connections and losses of the same rounds.
type programCost struct {
	Programs []programRun
	Rounds   int
	Conns    uint64
	Lost     int64
}

func (r *report) programCost() programCost {
	var c programCost
	at := map[string]int{}
	for _, x := range r.rounds {
		if x.Variant != statsName {
			continue
		}
		c.Rounds++
		c.Conns += x.Load.OK
		c.Lost += max(x.Obs.Lost, 0)
		for _, p := range x.Obs.Programs {
			i, ok := at[p.Program]
			if !ok {
				i = len(c.Programs)
				at[p.Program] = i
				c.Programs = append(c.Programs, programRun{Program: p.Program, Via: p.Via, Hooks: p.Hooks})
			}
			c.Programs[i].Runs += p.Runs
			c.Programs[i].RunTime += p.RunTime
		}
	}
	return c
}

// total is every program together.
func (c programCost) total() programRun {
	t := programRun{Program: "all programs"}
	for _, p := range c.Programs {
		t.Runs += p.Runs
		t.RunTime += p.RunTime
	}
	return t
}

// largest is the program with the most run time.
func (c programCost) largest() programRun {
	var l programRun
	for _, p := range c.Programs {
		if p.RunTime > l.RunTime || l.Program == "" {
			l = p
		}
	}
	return l
}

func (c programCost) runsPerConn(p programRun) float64 {
	return float64(p.Runs) / float64(max(c.Conns, 1))
}

// usPerConn is the programs' own CPU time per connection, in µs.
func (c programCost) usPerConn(p programRun) float64 {
	return float64(p.RunTime) / float64(time.Microsecond) / float64(max(c.Conns, 1))
}

func nsPerRun(p programRun) float64 {
	return float64(p.RunTime.Nanoseconds()) / float64(max(p.Runs, 1))
}
