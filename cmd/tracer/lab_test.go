package main

import (
	"testing"
)

func TestLabStatusLine(t *testing.T) {
	s := &labStatus{total: 3}
	if text, alert := s.line(); text != "lab 0/3: 0 passed" || alert {
		t.Errorf("start: %q alert %v", text, alert)
	}
	s.start("hostport-hijack-clusterip")
	s.finish("hostport-hijack-clusterip", labPassed)
	s.start("ipvs-no-endpoint")
	s.finish("ipvs-no-endpoint", labSkipped)
	s.start("ping-clusterip")
	if text, _ := s.line(); text != "lab 2/3: 1 passed, 1 skipped · running ping-clusterip" {
		t.Errorf("running: %q", text)
	}
	s.finish("ping-clusterip", labFailed)
	s.recordFailed(errTest("record /x: no space left on device"))
	text, alert := s.line()
	if text != "lab 3/3: 1 passed, 1 FAILED (ping-clusterip), 1 skipped · record /x: no space left on device" || !alert {
		t.Errorf("end: %q alert %v", text, alert)
	}
}

type errTest string

func (e errTest) Error() string { return string(e) }
