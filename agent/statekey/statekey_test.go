package statekey

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/holdfast-dev/holdfast/offline"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// The stolen disk: a state key sealed by a gateway's TPM is of no use on another machine. The
// key file copied next to another TPM does not unseal, and the file itself holds no key
// offline.LoadKey would take; on its own TPM it gives the same key at every start.
func TestSealedKeyNeedsItsTPM(t *testing.T) {
	gateway, thief := testenv.StartSWTPM(t), testenv.StartSWTPM(t)
	path := filepath.Join(t.TempDir(), "state.key")

	key, made, err := Load(path, gateway.Socket)
	if err != nil || !made {
		t.Fatalf("first start with a TPM: made %v, %v; want a new key, sealed", made, err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 || !bytes.HasPrefix(b, []byte(sealedMagic)) {
		t.Errorf("key file: mode %v, %q...; want 0600 and sealed", fi.Mode().Perm(), b[:min(len(b), 48)])
	}
	again, made, err := Load(path, gateway.Socket)
	if err != nil || made || again.ID() != key.ID() {
		t.Fatalf("second start: key %v (made %v), %v; want key %s again", idOf(again), made, err, key.ID())
	}

	stolen := filepath.Join(t.TempDir(), "state.key")
	if err := os.WriteFile(stolen, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if k, _, err := Load(stolen, thief.Socket); !errors.Is(err, ErrWrongTPM) {
		t.Errorf("the key file next to another TPM: key %v, %v; want ErrWrongTPM", idOf(k), err)
	}
	if k, err := offline.LoadKey(stolen); err == nil {
		t.Errorf("the sealed file read as a raw key gave key %s", k.ID())
	}
}

// Whatever byte of the sealed file is altered, the TPM gives the sealed key or an error,
// never another key: the file's integrity is the TPM's to check, and holdfast's framing must
// not turn damage into a different key.
func TestAlteredSealedKeyNeverGivesAnotherKey(t *testing.T) {
	tpm := testenv.StartSWTPM(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "state.key")
	key, _, err := Load(path, tpm.Socket)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	for i := len(sealedMagic); i < len(sealed); i++ {
		altered := bytes.Clone(sealed)
		altered[i] ^= 1 << (i % 8)
		if err := os.WriteFile(path, altered, 0o600); err != nil {
			t.Fatal(err)
		}
		k, made, err := Load(path, tpm.Socket)
		switch {
		case made:
			t.Fatalf("byte %d altered: a new key was made over the damaged file", i)
		case err == nil && k.ID() != key.ID():
			t.Fatalf("byte %d altered: key %s, not the sealed %s", i, k.ID(), key.ID())
		case err != nil:
			refused++
		}
	}
	if refused == 0 {
		t.Fatalf("no alteration of %d bytes was refused", len(sealed)-len(sealedMagic))
	}
	t.Logf("%d of %d single-bit alterations refused, the rest gave the sealed key", refused, len(sealed)-len(sealedMagic))
}

// A raw key file where the sealed one is expected is refused, never sealed in place: whoever
// could write the disk would otherwise choose the key (put a raw key of theirs in the sealed
// file's place; the agent would seal it and seal every Secret with it). A key cut to 32 bytes
// (the first bytes of the sealed file's header, which everybody knows) is refused the same
// way. Removed, a new key is made and sealed.
func TestRawKeyRefusedWithTPM(t *testing.T) {
	tpm := testenv.StartSWTPM(t)
	path := filepath.Join(t.TempDir(), "state.key")
	raw := make([]byte, offline.KeySize)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	for _, planted := range [][]byte{raw, []byte(sealedMagic)[:offline.KeySize]} {
		if err := os.WriteFile(path, planted, 0o600); err != nil {
			t.Fatal(err)
		}
		if k, made, err := Load(path, tpm.Socket); !errors.Is(err, ErrRawKeyWithTPM) || made {
			t.Fatalf("a raw key file %q with a TPM configured: key %v (made %v), %v; want ErrRawKeyWithTPM", planted[:8], idOf(k), made, err)
		}
		if b, _ := os.ReadFile(path); !bytes.Equal(b, planted) {
			t.Fatal("the raw key file was changed")
		}
	}
	chosen, err := offline.NewKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	key, made, err := Load(path, tpm.Socket)
	if err != nil || !made || key.ID() == chosen.ID() {
		t.Fatalf("after removing the raw key: key %v (made %v), %v; want a new key", idOf(key), made, err)
	}
}

// A sealed key file others may read is refused as a raw one is (it names the TPM object
// that holds the key); so is a TPM path that is not there.
func TestSealedKeyRefusals(t *testing.T) {
	tpm := testenv.StartSWTPM(t)
	path := filepath.Join(t.TempDir(), "state.key")
	if _, _, err := Load(path, tpm.Socket); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Load(path, tpm.Socket); !errors.Is(err, offline.ErrKeyExposed) {
		t.Errorf("sealed key file of mode 0644: %v, want ErrKeyExposed", err)
	}
	if _, _, err := Load(filepath.Join(t.TempDir(), "state.key"), "/nonexistent/tpmrm0"); err == nil || !strings.Contains(err.Error(), "open the TPM") {
		t.Errorf("no TPM at the path configured: %v", err)
	}
}

func idOf(k *offline.Key) string {
	if k == nil {
		return "<none>"
	}
	return k.ID()
}

// Two starts that find no key file at once (the key is read before the database's lock is
// taken) end with one key: the first file made is the key, never replaced by the other's.
func TestConcurrentFirstStartsAgreeOnOneKey(t *testing.T) {
	tpm := testenv.StartSWTPM(t)
	path := filepath.Join(t.TempDir(), "state.key")
	const starts = 4
	ids := make(chan string, starts)
	errs := make(chan error, starts)
	var wg sync.WaitGroup
	for range starts {
		wg.Go(func() {
			k, _, err := Load(path, tpm.Socket)
			if err != nil {
				errs <- err
				return
			}
			ids <- k.ID()
		})
	}
	wg.Wait()
	close(ids)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	final, _, err := Load(path, tpm.Socket)
	if err != nil {
		t.Fatal(err)
	}
	for id := range ids {
		if id != final.ID() {
			t.Errorf("a start used key %s; the file holds %s", id, final.ID())
		}
	}
}

// A state key as systemd hands it over (LoadCredentialEncrypted=): a file in the service's
// $CREDENTIALS_DIRECTORY, mode 0400, in a directory only the service may read. It loads; a
// unit that passes no credentials is a clear error that names the unit setting to add.
func TestKeyFromSystemdCredential(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	if _, err := CredentialPath("holdfast-state-key"); !errors.Is(err, ErrNoCredentials) || !strings.Contains(err.Error(), "LoadCredentialEncrypted=holdfast-state-key:") {
		t.Errorf("no $CREDENTIALS_DIRECTORY: %v; want ErrNoCredentials naming LoadCredentialEncrypted=", err)
	}
	t.Setenv("CREDENTIALS_DIRECTORY", "relative/dir")
	if _, err := CredentialPath("k"); err == nil {
		t.Error("a relative $CREDENTIALS_DIRECTORY was taken")
	}

	dir := filepath.Join(t.TempDir(), "holdfast.service")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, offline.KeySize)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "holdfast-state-key"), raw, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o500); err != nil { // as systemd leaves it
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(dir, 0o700) })
	t.Setenv("CREDENTIALS_DIRECTORY", dir)
	path, err := CredentialPath("holdfast-state-key")
	if err != nil {
		t.Fatal(err)
	}
	key, made, err := Load(path, "")
	want, _ := offline.NewKey(raw)
	if err != nil || made || key.ID() != want.ID() {
		t.Fatalf("credential key: %v (made %v), %v; want key %s", idOf(key), made, err, want.ID())
	}
}
