// Package statekey finds the state key, the one that seals the Secrets and tokens the state
// store keeps for offline reboots: a file of 32 raw bytes, or a file that holds the key sealed
// by the gateway's TPM 2.0.
//
// A raw key file protects a copy of the database alone: whoever holds the disk holds the key
// beside it. Sealed by the TPM, the file is of no use without the TPM chip that sealed it: the
// key is a sealed data object under the TPM's storage root key (the TCG's ECC P-256 SRK
// template, derived again at each start from the owner hierarchy's seed, so nothing is kept
// in the TPM's own memory), fixed to that TPM and parent. The key is unsealed through a
// session salted to the SRK with its response encrypted, so that it does not cross the bus in
// the clear. It is not bound to PCR values: a firmware update would then lock the gateway out
// of its own records.
package statekey

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
	"github.com/google/go-tpm/tpm2/transport/linuxtpm"
	"github.com/google/go-tpm/tpm2/transport/linuxudstpm"

	"github.com/holdfast-dev/holdfast/internal/fsutil"
	"github.com/holdfast-dev/holdfast/offline"
)

// sealedMagic opens a key file sealed by a TPM; what follows is the name of the storage root
// key it was sealed under, then the sealed object's public and private parts, each after its
// length (uvarint).
const sealedMagic = "holdfast state key sealed by TPM 2.0, v1\n"

// ErrWrongTPM is the error for a sealed key file the TPM cannot unseal: sealed by another TPM
// (the disk was moved, or copied), or altered.
var ErrWrongTPM = errors.New("the TPM cannot unseal the state key")

// ErrRawKeyWithTPM is Load's error for a raw key file where the key sealed by the TPM is
// expected. It is never sealed in place: whoever could write the disk could otherwise choose
// the key (replace the sealed file with a raw key of theirs, which would then be sealed and
// used), and a raw key that once lay on the flash stays readable in its freed blocks. Remove
// the file to make a new key, sealed: what the old key sealed (Secrets, tokens) is read again
// from the apiserver.
var ErrRawKeyWithTPM = errors.New("the state key file holds a raw key, not one sealed by the TPM")

// Load returns the state key of path. With tpmPath "" the file holds the key's raw bytes
// (offline.LoadKey). Otherwise tpmPath names the TPM (the kernel's resource manager,
// /dev/tpmrm0, or a TPM simulator's unix socket) and the file holds the key sealed by it: a
// missing file gets a new key, sealed; a raw key file is refused (ErrRawKeyWithTPM). made
// reports that a new key was made.
func Load(path, tpmPath string) (key *offline.Key, made bool, err error) {
	if tpmPath == "" {
		key, err = offline.LoadKey(path)
		return key, false, err
	}
	b, err := offline.ReadKeyFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		raw := make([]byte, offline.KeySize)
		if _, err := rand.Read(raw); err != nil {
			return nil, false, fmt.Errorf("make a state key: %w", err)
		}
		switch err := sealTo(path, tpmPath, raw); {
		case errors.Is(err, fs.ErrExist):
			// Another start made one meanwhile (the key is read before the database's lock
			// is taken): that one is the key.
			return Load(path, tpmPath)
		case err != nil:
			return nil, false, err
		}
		key, err = offline.NewKey(raw)
		return key, true, err
	case err != nil:
		return nil, false, err
	case !bytes.HasPrefix(b, []byte(sealedMagic)):
		return nil, false, fmt.Errorf("state key %s: %w (stateKeyTPM is set): remove it to have a new key made and sealed; what the old key sealed is then read again from the apiserver", path, ErrRawKeyWithTPM)
	}
	raw, err := unsealFrom(b, tpmPath)
	if err != nil {
		return nil, false, fmt.Errorf("state key %s: %w", path, err)
	}
	key, err = offline.NewKey(raw)
	if err != nil {
		return nil, false, fmt.Errorf("state key %s, unsealed: %w", path, err)
	}
	return key, false, nil
}

// sealTo seals raw with the TPM and makes path hold it (0600). It never replaces a file: if
// path exists meanwhile, the error wraps fs.ErrExist. Durable: a power cut right after leaves
// the file, or no file and no record sealed with the new key.
func sealTo(path, tpmPath string, raw []byte) error {
	tpm, err := openTPM(tpmPath)
	if err != nil {
		return err
	}
	defer tpm.Close()
	blob, err := seal(tpm, raw)
	if err != nil {
		return fmt.Errorf("seal the state key with the TPM at %s: %w", tpmPath, err)
	}
	if err := fsutil.CreateFileExclusive(path, blob, 0o600); err != nil {
		return fmt.Errorf("write the sealed state key: %w", err)
	}
	return nil
}

func unsealFrom(b []byte, tpmPath string) ([]byte, error) {
	tpm, err := openTPM(tpmPath)
	if err != nil {
		return nil, err
	}
	defer tpm.Close()
	return unseal(tpm, b)
}

// tpmMu serializes this process's use of TPMs: a TPM without a resource manager (a
// simulator's socket, /dev/tpm0) takes one client at a time and has room for few objects and
// sessions; the kernel's /dev/tpmrm0 does the same between processes.
var tpmMu sync.Mutex

// lockedTPM is a TPM held under tpmMu until closed.
type lockedTPM struct{ transport.TPMCloser }

func (t lockedTPM) Close() error {
	defer tpmMu.Unlock()
	return t.TPMCloser.Close()
}

// openTPM opens the TPM at path, for this process alone until it is closed: a unix socket is
// a simulator's (swtpm), anything else a character device.
func openTPM(path string) (tpm transport.TPMCloser, err error) {
	tpmMu.Lock()
	defer func() {
		if err != nil {
			tpmMu.Unlock()
		} else {
			tpm = lockedTPM{tpm}
		}
	}()
	fi, err := os.Stat(path)
	if err != nil {
		// %v, not %w: a TPM device that is not there is not a missing key file (the agent
		// would say it has none and make do without).
		return nil, fmt.Errorf("open the TPM: %v", err)
	}
	if fi.Mode()&fs.ModeSocket != 0 {
		tpm, err = linuxudstpm.Open(path)
	} else {
		tpm, err = linuxtpm.Open(path)
	}
	if err != nil {
		return nil, fmt.Errorf("open the TPM at %s: %v", path, err)
	}
	return tpm, nil
}

// srk makes the storage root key again (the same key every time from the owner hierarchy's
// seed) and returns it loaded; the caller flushes it.
func srk(tpm transport.TPM) (*tpm2.CreatePrimaryResponse, error) {
	rsp, err := tpm2.CreatePrimary{
		PrimaryHandle: tpm2.TPMRHOwner,
		InPublic:      tpm2.New2B(tpm2.ECCSRKTemplate),
	}.Execute(tpm)
	if err != nil {
		return nil, fmt.Errorf("create the storage root key: %w", err)
	}
	return rsp, nil
}

func flush(tpm transport.TPM, h tpm2.TPMHandle) {
	_, _ = tpm2.FlushContext{FlushHandle: h}.Execute(tpm)
}

// seal returns raw sealed by tpm, as the key file holds it.
func seal(tpm transport.TPM, raw []byte) ([]byte, error) {
	parent, err := srk(tpm)
	if err != nil {
		return nil, err
	}
	defer flush(tpm, parent.ObjectHandle)
	srkPub, err := parent.OutPublic.Contents()
	if err != nil {
		return nil, fmt.Errorf("storage root key: %w", err)
	}
	rsp, err := tpm2.Create{
		// The key crosses the bus encrypted, in a session salted to the SRK.
		ParentHandle: tpm2.AuthHandle{Handle: parent.ObjectHandle, Name: parent.Name,
			Auth: tpm2.HMAC(tpm2.TPMAlgSHA256, 16, tpm2.AESEncryption(128, tpm2.EncryptIn), tpm2.Salted(parent.ObjectHandle, *srkPub))},
		InSensitive: tpm2.TPM2BSensitiveCreate{Sensitive: &tpm2.TPMSSensitiveCreate{
			Data: tpm2.NewTPMUSensitiveCreate(&tpm2.TPM2BSensitiveData{Buffer: raw}),
		}},
		InPublic: tpm2.New2B(tpm2.TPMTPublic{
			Type:    tpm2.TPMAlgKeyedHash,
			NameAlg: tpm2.TPMAlgSHA256,
			ObjectAttributes: tpm2.TPMAObject{
				FixedTPM:     true, // never leaves this TPM
				FixedParent:  true,
				UserWithAuth: true, // no policy: no PCRs to be locked out by
				NoDA:         true,
			},
		}),
	}.Execute(tpm)
	if err != nil {
		return nil, fmt.Errorf("create the sealed object: %w", err)
	}
	b := []byte(sealedMagic)
	for _, part := range [][]byte{parent.Name.Buffer, tpm2.Marshal(rsp.OutPublic), tpm2.Marshal(rsp.OutPrivate)} {
		b = binary.AppendUvarint(b, uint64(len(part)))
		b = append(b, part...)
	}
	return b, nil
}

// unseal returns the key a sealed key file holds.
func unseal(tpm transport.TPM, b []byte) ([]byte, error) {
	srkName, pub, priv, err := splitSealed(b)
	if err != nil {
		return nil, err
	}
	parent, err := srk(tpm)
	if err != nil {
		return nil, err
	}
	defer flush(tpm, parent.ObjectHandle)
	// The SRK the key was sealed under, not one a device between the agent and the TPM
	// answers with to learn the session's salt.
	if !bytes.Equal(parent.Name.Buffer, srkName) {
		return nil, fmt.Errorf("%w: the TPM's storage root key is not the one the key was sealed under", ErrWrongTPM)
	}
	loaded, err := tpm2.Load{
		ParentHandle: tpm2.NamedHandle{Handle: parent.ObjectHandle, Name: parent.Name},
		InPrivate:    *priv,
		InPublic:     *pub,
	}.Execute(tpm)
	if err != nil {
		return nil, fmt.Errorf("%w (sealed by another TPM, or altered): load: %w", ErrWrongTPM, err)
	}
	defer flush(tpm, loaded.ObjectHandle)
	srkPub, err := parent.OutPublic.Contents()
	if err != nil {
		return nil, fmt.Errorf("storage root key: %w", err)
	}
	rsp, err := tpm2.Unseal{
		ItemHandle: tpm2.AuthHandle{
			Handle: loaded.ObjectHandle,
			Name:   loaded.Name,
			Auth: tpm2.HMAC(tpm2.TPMAlgSHA256, 16, tpm2.AESEncryption(128, tpm2.EncryptOut),
				tpm2.Salted(parent.ObjectHandle, *srkPub)),
		},
	}.Execute(tpm)
	if err != nil {
		return nil, fmt.Errorf("%w: unseal: %w", ErrWrongTPM, err)
	}
	return rsp.OutData.Buffer, nil
}

// splitSealed reads the parts of a sealed key file.
func splitSealed(b []byte) (srkName []byte, pub *tpm2.TPM2BPublic, priv *tpm2.TPM2BPrivate, err error) {
	rest, ok := bytes.CutPrefix(b, []byte(sealedMagic))
	if !ok {
		return nil, nil, nil, fmt.Errorf("%w: not a key sealed by a TPM", offline.ErrInvalid)
	}
	var parts [3][]byte
	for i, what := range []string{"storage root key name", "public part", "private part"} {
		n, size := binary.Uvarint(rest)
		if size <= 0 || n > uint64(len(rest)-size) {
			return nil, nil, nil, fmt.Errorf("%w: the sealed key's %s is cut", offline.ErrInvalid, what)
		}
		parts[i], rest = rest[size:size+int(n)], rest[size+int(n):]
	}
	if pub, err = tpm2.Unmarshal[tpm2.TPM2BPublic](parts[1]); err != nil {
		return nil, nil, nil, fmt.Errorf("%w: the sealed key's public part: %w", offline.ErrInvalid, err)
	}
	if priv, err = tpm2.Unmarshal[tpm2.TPM2BPrivate](parts[2]); err != nil {
		return nil, nil, nil, fmt.Errorf("%w: the sealed key's private part: %w", offline.ErrInvalid, err)
	}
	return parts[0], pub, priv, nil
}

// ErrNoCredentials is CredentialPath's error when systemd passed the agent no credentials.
var ErrNoCredentials = errors.New("$CREDENTIALS_DIRECTORY is not set: the agent was not started by a systemd unit that passes it credentials")

// CredentialPath is where systemd put the credential name for this service: the directory in
// $CREDENTIALS_DIRECTORY (systemd.exec(5): set when the unit has LoadCredential=,
// LoadCredentialEncrypted= or SetCredential=), never a path guessed from the unit's name.
func CredentialPath(name string) (string, error) {
	dir := os.Getenv("CREDENTIALS_DIRECTORY")
	if dir == "" {
		return "", fmt.Errorf("state key credential %q: %w; add LoadCredentialEncrypted=%s:/etc/holdfast/%s.cred to holdfast.service (firmware/systemd/state-key-credential.conf)", name, ErrNoCredentials, name, name)
	}
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("state key credential %q: $CREDENTIALS_DIRECTORY %q is not an absolute path", name, dir)
	}
	return filepath.Join(dir, name), nil
}
