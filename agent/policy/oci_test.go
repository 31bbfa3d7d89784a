package policy

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/holdfast-dev/holdfast/offline"
	"github.com/holdfast-dev/holdfast/test/testenv"
	"github.com/holdfast-dev/holdfast/wasm"
	"github.com/holdfast-dev/holdfast/wasm/wasmtest"
)

func TestConfigOCIModule(t *testing.T) {
	pinned := "sha256:" + strings.Repeat("ab", 32)
	cases := []struct {
		name, module string
		err          string // "" = valid
	}{
		{"digest", "oci://registry.example:5000/policies/deny@" + pinned, ""},
		{"tag and digest: the digest pins", "oci://registry.example/policies/deny:v1@" + pinned, ""},
		{"tag alone", "oci://registry.example:5000/policies/deny:v1", "not pinned by digest: write oci://registry.example:5000/policies/deny@sha256:"},
		{"no tag nor digest", "oci://registry.example/policies/deny", "not pinned by digest"},
		{"sha512", "oci://registry.example/policies/deny@sha512:" + strings.Repeat("ab", 64), "only sha256"},
		{"bad digest", "oci://registry.example/policies/deny@sha256:xyz", "oci://registry.example/policies/deny@sha256:xyz"},
		{"no repository", "oci://registry.example@" + pinned, "oci://registry.example@"},
		{"local file as before", "deny.wasm", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(fmt.Sprintf("apiVersion: holdfast.dev/v1alpha1\nkind: PolicyConfig\npolicies:\n- {name: p, kind: admission, module: %q}\n", tc.module)))
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.err != "" && err == nil:
				t.Fatalf("accepted")
			case tc.err != "" && !strings.Contains(err.Error(), tc.err):
				t.Fatalf("error %q does not say %q", err, tc.err)
			}
		})
	}
}

func TestWasmLayer(t *testing.T) {
	layer := func(mt string) string {
		return fmt.Sprintf(`{"mediaType":%q,"digest":"sha256:%s","size":8}`, mt, strings.Repeat("0", 64))
	}
	manifest := func(layers ...string) []byte {
		return []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.wasm.config.v1+json","digest":"sha256:` +
			strings.Repeat("1", 64) + `","size":2},"layers":[` + strings.Join(layers, ",") + `]}`)
	}
	cases := []struct {
		name      string
		mediaType string
		manifest  []byte
		err       string
	}{
		{"kubewarden", ocispec.MediaTypeImageManifest, manifest(layer(MediaTypeWasmLayer)), ""},
		{"cncf", "", manifest(layer(MediaTypeWasmLayerCNCF)), ""},
		{"no wasm layer", ocispec.MediaTypeImageManifest, manifest(layer("application/vnd.oci.image.layer.v1.tar")), "0 Wasm layers"},
		{"two wasm layers", ocispec.MediaTypeImageManifest, manifest(layer(MediaTypeWasmLayer), layer(MediaTypeWasmLayerCNCF)), "2 Wasm layers"},
		{"an index", ocispec.MediaTypeImageIndex, []byte(`{"schemaVersion":2,"manifests":[]}`), "not an image manifest"},
		{"not JSON", ocispec.MediaTypeImageManifest, []byte("garbage"), "decode manifest"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := wasmLayer(tc.mediaType, tc.manifest)
			if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("wasmLayer: %v, want %q", err, tc.err)
			}
		})
	}
}

// TestFetch pulls from a real registry: the module comes back verified; a digest the
// registry does not have, or an artifact without a Wasm layer, is an error naming why.
func TestFetch(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	ctx := context.Background()
	module := []byte("\x00asm\x01\x00\x00\x00 stands for a module")
	pinned := reg.PushArtifact(ctx, "policies/p:v1", MediaTypeWasmLayer, module)
	noWasm := reg.PushArtifact(ctx, "policies/p:tar", "application/vnd.oci.image.layer.v1.tar", module)
	f := fetcher{opts: RegistryOptions{Hosts: plainHTTP, PullTimeout: 10 * time.Second}}
	ref := func(d digest.Digest) ociRef {
		r, err := parseOCIRef("oci://" + reg.Host + "/policies/p@" + d.String())
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	got, err := f.fetch(ctx, ref(pinned))
	if err != nil || string(got.module) != string(module) {
		t.Fatalf("fetch = %q, %v", got.module, err)
	}
	if err := got.verify(ref(pinned)); err != nil {
		t.Errorf("the artifact fetched does not verify: %v", err)
	}
	if back, err := decodeArtifact(encodeArtifact(got)); err != nil || back.verify(ref(pinned)) != nil || string(back.module) != string(module) {
		t.Errorf("the artifact as stored and read back: %+v, %v", back, err)
	}
	if _, err := f.fetch(ctx, ref(digest.FromString("another manifest"))); err == nil || !strings.Contains(err.Error(), "fetch manifest") {
		t.Errorf("fetch of a digest the registry lacks: %v", err)
	}
	if _, err := f.fetch(ctx, ref(noWasm)); err == nil || !strings.Contains(err.Error(), "0 Wasm layers") {
		t.Errorf("fetch of an artifact without a Wasm layer: %v", err)
	}
	reg.Stop()
	if _, err := f.fetch(ctx, ref(pinned)); err == nil {
		t.Errorf("fetch with the registry stopped succeeded")
	}
}

// TestOCIPolicyLifecycle: a policy delivered from a registry is pulled in the background,
// kept in the store and used; a new digest replaces it and the old one is collected; a
// version that fails to load leaves the previous one serving and is reported once; a
// manager opened on the same store with the registry gone loads it from the store.
func TestOCIPolicyLifecycle(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	ctx := context.Background()
	f := newFixture(t)
	allow := reg.PushArtifact(ctx, "policies/p:allow", MediaTypeWasmLayer, f.wat("allow"))
	deny := reg.PushArtifact(ctx, "policies/p:deny", MediaTypeWasmLayer, f.wat("deny"))
	broken := reg.PushArtifact(ctx, "policies/p:broken", MediaTypeWasmLayer, []byte("not a wasm module"))
	store := offline.NewMemStore(nil)

	var mu sync.Mutex
	var failures []string
	open := func() *Manager {
		m, err := Open(ctx, Options{Dir: f.dir, CacheDir: wasmtest.CacheDir(t, "wazero"), ReloadDelay: 50 * time.Millisecond,
			Modules: store, Registry: RegistryOptions{Hosts: plainHTTP, PullTimeout: 10 * time.Second},
			OnFailure: func(f Failure) {
				mu.Lock()
				defer mu.Unlock()
				failures = append(failures, f.Policy+" "+f.Module+" serving "+f.Serving+": "+f.Err.Error())
			}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close(context.Background()) })
		return m
	}
	run := func(m *Manager) (stop func()) {
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- m.Run(runCtx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}
	configure := func(d digest.Digest) string {
		ref := "oci://" + reg.Host + "/policies/p@" + d.String()
		f.config(fmt.Sprintf("- {name: p, kind: admission, module: %q}\n", ref))
		return ref
	}
	waitDecision := func(m *Manager, allowed bool, module []byte) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			d := m.Admit(ctx, pod(), node)
			st, _ := m.Status()
			if d.Allowed == allowed && len(st) == 1 && st[0].Digest == wasm.Digest(module) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("decision %+v, status %+v; want allowed=%v", d, st, allowed)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// Not yet pulled: not loaded, its failurePolicy (Fail) denies; no failure reported.
	configure(allow)
	m := open()
	if d := m.Admit(ctx, pod(), node); d.Allowed || !strings.Contains(d.Message, "not loaded") {
		t.Fatalf("before the pull: %+v", d)
	}
	stop := run(m)
	waitDecision(m, true, f.wat("allow"))
	if _, err := store.GetPolicyModule(allow.String()); err != nil {
		t.Fatalf("pulled module not kept in the store: %v", err)
	}

	// A new digest: pulled, used, and the old one collected.
	configure(deny)
	waitDecision(m, false, f.wat("deny"))
	waitStored(t, store, deny.String())

	// A broken version: the previous one keeps serving, and it is said once.
	brokenRef := configure(broken)
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, _ := m.Status()
		if len(st) == 1 && strings.Contains(st[0].Error, brokenRef) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status %+v does not report the broken module", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := m.Reload(ctx); err == nil {
		t.Fatal("Reload of a broken module succeeded")
	}
	waitDecision(m, false, f.wat("deny"))
	mu.Lock()
	if len(failures) != 1 || !strings.Contains(failures[0], brokenRef) || !strings.Contains(failures[0], "serving "+wasm.Digest(f.wat("deny"))) {
		t.Errorf("failures reported = %q, want one naming %s and the deny module serving", failures, brokenRef)
	}
	mu.Unlock()
	stop()
	waitStored(t, store, broken.String(), deny.String())

	// Offline reboot on the broken version: nothing serves the policy (Fail denies), and the
	// last good version stays in the store, so that a rollback works with no registry.
	reg.Stop()
	m2 := open()
	if d := m2.Admit(ctx, pod(), node); d.Allowed || d.Reason != ReasonError {
		t.Fatalf("after an offline reboot on the broken version: %+v", d)
	}
	waitStored(t, store, broken.String(), deny.String())
	configure(deny)
	if err := m2.Reload(ctx); err != nil {
		t.Fatalf("rollback with no registry: %v", err)
	}
	if d := m2.Admit(ctx, pod(), node); d.Allowed || d.Policy != "p" || d.Reason != "NotOnThisNode" {
		t.Fatalf("after the rollback: %+v", d)
	}
	waitStored(t, store, deny.String()) // all served: the broken one collected
}

// TestStoredModuleCheckedAtEveryLoad: whoever can write the state store (a stolen and
// returned disk, a process with the agent's rights) cannot make the agent run a module other
// than the one policies.yaml pins. A record whose module was swapped for another valid module,
// a record of another digest copied under the pinned one, and a bare module (as holdfast kept
// them before) are each refused at load with a reason, and pulled again while the registry
// answers; with no registry the policy is not loaded and its failurePolicy decides.
func TestStoredModuleCheckedAtEveryLoad(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	ctx := context.Background()
	f := newFixture(t)
	allow := reg.PushArtifact(ctx, "policies/p:allow", MediaTypeWasmLayer, f.wat("allow"))
	deny := reg.PushArtifact(ctx, "policies/p:deny", MediaTypeWasmLayer, f.wat("deny"))
	store := offline.NewMemStore(nil)
	f.config(fmt.Sprintf("- {name: p, kind: admission, module: %q}\n", "oci://"+reg.Host+"/policies/p@"+deny.String()))
	// The allow module's record as the puller keeps it, under its own digest.
	allowRef, err := parseOCIRef("oci://" + reg.Host + "/policies/p@" + allow.String())
	if err != nil {
		t.Fatal(err)
	}
	allowArtifact, err := fetcher{opts: RegistryOptions{Hosts: plainHTTP, PullTimeout: 10 * time.Second}}.fetch(ctx, allowRef)
	if err != nil {
		t.Fatal(err)
	}
	allowRecord := encodeArtifact(allowArtifact)

	// open opens a manager on the store, as an agent starts; run: with its puller. The manager
	// stops at the end of the attack it serves.
	open := func(run bool) (*Manager, func()) {
		m, err := Open(ctx, Options{Dir: f.dir, CacheDir: wasmtest.CacheDir(t, "wazero"), ReloadDelay: 50 * time.Millisecond,
			Modules: store, Registry: RegistryOptions{Hosts: plainHTTP, PullTimeout: 10 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		stop := func() { m.Close(context.Background()) }
		if run {
			runCtx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- m.Run(runCtx) }()
			stop = func() { cancel(); <-done; m.Close(context.Background()) }
		}
		return m, stop
	}
	waitServing := func(m *Manager, module []byte) {
		t.Helper()
		testenv.Eventually(t, 20*time.Second, "policy serving "+wasm.Digest(module), func() error {
			st, _ := m.Status()
			if len(st) != 1 || st[0].Digest != wasm.Digest(module) || st[0].Error != "" {
				return fmt.Errorf("status %+v", st)
			}
			return nil
		})
	}
	m, stop := open(true)
	waitServing(m, f.wat("deny"))
	stop()
	genuine, err := store.GetPolicyModule(deny.String())
	if err != nil {
		t.Fatal(err)
	}
	swapped, err := decodeArtifact(genuine)
	if err != nil {
		t.Fatal(err)
	}
	swapped.module = f.wat("allow")
	attacks := []struct {
		name   string
		record []byte
		reason string
	}{
		{"module swapped for another", encodeArtifact(swapped), "its manifest names"},
		{"another digest's record copied", allowRecord, "not the " + deny.String() + " pinned"},
		{"bare module", f.wat("allow"), "no manifest"},
	}
	for _, a := range attacks {
		// While the registry answers: refused, and the genuine module pulled again.
		if err := store.PutPolicyModule(deny.String(), a.record); err != nil {
			t.Fatal(err)
		}
		m, stop := open(true)
		if d := m.Admit(ctx, pod(), node); d.Allowed {
			t.Errorf("%s: the altered record was run: %+v", a.name, d)
		}
		waitServing(m, f.wat("deny"))
		stop()
		if got, _ := store.GetPolicyModule(deny.String()); !bytes.Equal(got, genuine) {
			t.Errorf("%s: the record was not replaced by the genuine one", a.name)
		}
	}
	reg.Stop()
	for _, a := range attacks {
		// With no registry: refused, said, and the failurePolicy (Fail) decides.
		if err := store.PutPolicyModule(deny.String(), a.record); err != nil {
			t.Fatal(err)
		}
		m, stop := open(false)
		d := m.Admit(ctx, pod(), node)
		st, _ := m.Status()
		stop()
		if d.Allowed || d.Reason != ReasonError || len(st) != 1 || !strings.Contains(st[0].Error, "is not the module pinned") || !strings.Contains(st[0].Error, a.reason) {
			t.Errorf("%s, offline: decision %+v, status %+v; want the policy refused because %q", a.name, d, st, a.reason)
		}
	}
}

// waitStored waits until the store holds exactly the digests given (sorted).
func waitStored(t *testing.T, store ModuleStore, want ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := store.PolicyModules()
		if err == nil && strings.Join(got, ",") == strings.Join(slices.Sorted(slices.Values(want)), ",") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stored modules %v, want %v", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// plainHTTP reaches the test registry over plain HTTP (the agent reads the endpoints from the
// image pulls' host configuration instead: TestOCIPolicies in agent/).
func plainHTTP(_ context.Context, registry string) ([]RegistryHost, error) {
	return []RegistryHost{{Host: registry, PlainHTTP: true}}, nil
}

// TestOCIDeliveredOPAPolicy: a Rego policy's module (the policy.wasm of opa build -t wasm) is
// delivered from a registry like any other, and judges pods as kind opa, with the data its
// settings give.
func TestOCIDeliveredOPAPolicy(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	ctx := context.Background()
	f := newFixture(t)
	module := testenv.OPAModule(t, testenv.OPABundle(t, registriesRego, `{"allowed_prefix": "x"}`, "holdfast/admission/deny"))
	d := reg.PushArtifact(ctx, "policies/rego:v1", MediaTypeWasmLayer, module)
	f.config(fmt.Sprintf("- {name: rego, kind: opa, module: %q, entrypoint: holdfast/admission/deny, settings: {allowed_prefix: \"registry.local/\"}}\n",
		"oci://"+reg.Host+"/policies/rego@"+d.String()))
	m, err := Open(ctx, Options{Dir: f.dir, CacheDir: wasmtest.CacheDir(t, "wazero"), Modules: offline.NewMemStore(nil),
		Registry: RegistryOptions{Hosts: plainHTTP, PullTimeout: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(ctx)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Run(runCtx) }()
	defer func() {
		cancel()
		<-done
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		dec := m.Admit(ctx, pod(), node)
		if !dec.Allowed && strings.Contains(dec.Message, `image "nginx:1.27" of edge/web is not from registry.local/`) {
			return
		}
		if time.Now().After(deadline) {
			st, _ := m.Status()
			t.Fatalf("decision %+v, status %+v", dec, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
