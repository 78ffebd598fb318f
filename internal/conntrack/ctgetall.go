package conntrack

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
)

// getBatch is how many GETs one write carries. The kernel answers each
// inside that sendmsg with an skb of about a page (ctnetlink allocates
// NLMSG_DEFAULT_SIZE for a reply), all queued before one is read: 16 take
// under a third of the socket's default 208 KiB receive buffer (40 fit),
// so a batch does not overrun it. BenchmarkPrivGetAll: 5.8 µs an entry
// one GET at a time, 3.4-3.6 in writes of 16 read by one recvmmsg; 32 a
// write saved 0.2 µs more.
const getBatch = 16

// replySlot holds one reply: an entry's message is a few hundred bytes
// (tuples, status, protoinfo, mark, zone, counters, labels). A reply that
// does not fit (MSG_TRUNC) is asked for again alone, into the 16 KiB
// buffer of get.
const replySlot = 2048

// getAll is get of every tuple, answered into entries and found (as long
// as tus): the requests go getBatch to a write, their replies are read
// together. A reply the kernel dropped (its socket's buffer was full), or
// too long for its slot, is asked for again alone.
func (g *getter) getAll(tus []event.Tuple, entries []Entry, found []bool) error {
	for start := 0; start < len(tus); start += getBatch {
		end := min(start+getBatch, len(tus))
		if err := g.getBatch(tus[start:end], entries[start:end], found[start:end]); err != nil {
			return err
		}
	}
	return nil
}

func (g *getter) getBatch(tus []event.Tuple, entries []Entry, found []bool) error {
	answered, err := g.askTogether(tus, entries, found)
	if err != nil {
		return err
	}
	for i, tu := range tus {
		if answered&(1<<i) != 0 {
			continue
		}
		e, ok, err := g.get(tu)
		if err != nil {
			return err
		}
		entries[i], found[i] = e, ok
	}
	return nil
}

// askTogether sends one write of len(tus) (at most getBatch) GETs and
// reads the replies; answered has bit i set for each tuple whose reply
// was read. The kernel answers every GET inside the write, so what is not
// queued once it returned was dropped: nothing is waited for.
func (g *getter) askTogether(tus []event.Tuple, entries []Entry, found []bool) (answered uint64, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return 0, errClosed
	}
	if g.batch == nil {
		g.batch = newDatagrams(getBatch, replySlot)
	}
	first := g.seq + 1
	g.req = g.req[:0]
	for _, tu := range tus {
		g.seq++
		g.req = appendGetRequest(g.req, tu, g.seq)
	}
	if err := g.send(); err != nil {
		return 0, fmt.Errorf("send conntrack gets: %w", err)
	}
	want := uint64(1)<<len(tus) - 1
	for answered != want {
		n, err := g.batch.receive(g.fd)
		switch {
		case errors.Is(err, unix.ENOBUFS), errors.Is(err, unix.EINTR):
			// The replies queued before the overrun are still there;
			// reading them all also ends the socket's congestion, in
			// which the kernel drops replies without a word.
			continue
		case errors.Is(err, unix.EAGAIN):
			return answered, nil
		case err != nil:
			return answered, fmt.Errorf("receive conntrack get replies: %w", err)
		}
		for i := range n {
			if b, truncated := g.batch.at(i); !truncated {
				answered |= g.takeReply(b, first, entries, found)
			}
		}
	}
	return answered, nil
}

// takeReply files a reply to request first+i under i, returning its bit;
// a stale reply to an earlier request is no one's.
func (g *getter) takeReply(b []byte, first uint32, entries []Entry, found []bool) uint64 {
	if len(b) < nlmsgHdrLen {
		return 0
	}
	i := int(seqOf(b) - first)
	if i >= len(entries) {
		return 0
	}
	e, ok, done, err := parseGetReply(b, first+uint32(i))
	if !done || err != nil {
		return 0
	}
	entries[i], found[i] = e, ok
	return 1 << i
}
