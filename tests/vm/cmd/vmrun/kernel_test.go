package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestSortNewestFirst(t *testing.T) {
	names := []string{
		"linux-image-6.12.99+deb12-amd64",
		"linux-image-6.12.117+deb12-amd64",
		"linux-image-6.12.9+deb12-amd64",
	}
	sortNewestFirst(names)
	want := []string{
		"linux-image-6.12.117+deb12-amd64",
		"linux-image-6.12.99+deb12-amd64",
		"linux-image-6.12.9+deb12-amd64",
	}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("sortNewestFirst = %v, want %v", names, want)
	}
}

func TestSeriesMatch(t *testing.T) {
	cases := map[string]string{
		"linux-image-5.10.0-46-amd64":            "5.10",
		"linux-image-6.1.0-57-amd64":             "6.1",
		"linux-image-6.12.117+deb12-amd64":       "6.12",
		"linux-image-6.12.117+deb12-cloud-amd64": "",
		"linux-image-6.1.0-57-rt-amd64":          "",
		"linux-image-6.1.0-57-amd64-dbg":         "",
		"linux-image-5.10.0-46-amd64-unsigned":   "",
	}
	for name, want := range cases {
		got := ""
		for _, s := range allSeries {
			if s.Match.MatchString(name) {
				got = s.Name
			}
		}
		if got != want {
			t.Errorf("%s matches series %q, want %q", name, got, want)
		}
	}
}

func TestHostMirrors(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sources.list.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("sources.list", "# nothing here\n")
	write("sources.list.d/other.list", "deb [signed-by=/k.gpg] https://vendor.example/apt cloud-sdk main\n")
	write("sources.list.d/off.list.disabled", "deb http://wrong.example/debian bookworm main\n")
	write("sources.list.d/debian.sources", `Types: deb
# http://old.example/archive
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
`)
	m, err := hostMirrors(dir)
	if err != nil {
		t.Fatalf("hostMirrors: %v", err)
	}
	if m.Archive != "http://mirror.example/debian" || m.Security != "http://mirror.example/debian-security" {
		t.Errorf("hostMirrors = %+v", m)
	}
	list := sourcesList(m, "bullseye")
	for _, want := range []string{
		"http://mirror.example/debian bullseye main\n",
		"http://mirror.example/debian bullseye-updates main\n",
		"http://mirror.example/debian-security bullseye-security main\n",
	} {
		if !strings.Contains(list, want) {
			t.Errorf("sources list lacks %q:\n%s", want, list)
		}
	}
}

func TestHostMirrorsOneLine(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "sources.list"), []byte("deb [arch=amd64] http://m.example/debian bookworm main contrib # comment\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := hostMirrors(dir)
	if err != nil {
		t.Fatalf("hostMirrors: %v", err)
	}
	if m.Archive != "http://m.example/debian" || m.Security != "http://m.example/debian-security" {
		t.Errorf("hostMirrors = %+v", m)
	}
	if _, err := hostMirrors(t.TempDir()); err == nil {
		t.Error("hostMirrors of an empty apt dir: want an error")
	}
}
