"""Repositories on the Hugging Face Hub, through `huggingface_hub`: a reference's repository and revision, what a
repository holds, and its files fetched into the Hugging Face cache (resumed when interrupted, reused offline).

Everything here is `huggingface_hub`'s own client code (its endpoint, token, cache and offline settings come
from the usual HF_* variables); this module only decides which files to ask for and turns the library's errors
into one sentence the user can act on.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import VibeVoiceError
from .home import offline

_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_REVISION = re.compile(r"[A-Za-z0-9._/-]{1,200}")
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class HubRef:
    repo: str
    revision: str | None = None  # a branch, tag or commit; None: the repository's default branch

    def __str__(self) -> str:
        return self.repo + (f"@{self.revision}" if self.revision else "")

    @property
    def folder_name(self) -> str:
        """The repository as one path component (the Hugging Face cache's own spelling)."""
        return self.repo.replace("/", "--")


def parse_ref(ref: str, revision: str | None = None) -> HubRef | None:
    """ORG/NAME or ORG/NAME@REVISION as a HubRef (`revision` overrides one given after @); None if `ref` is not
    spelled as a repository id."""
    repo, _, pinned = str(ref).partition("@")
    if not _REPO_ID.fullmatch(repo) or ".." in repo:
        return None
    revision = revision or pinned or None
    if revision is not None and (not _REVISION.fullmatch(revision) or ".." in revision):
        raise VibeVoiceError(f"'{revision}' is not a usable revision (a branch, tag or commit hash)")
    return HubRef(repo, revision)


class HubUnreachable(VibeVoiceError):
    """No connection to the Hub (refused, timed out, a proxy or DNS failure): the caches may still serve."""


@contextmanager
def hub_errors(ref: HubRef, what: str):
    """huggingface_hub's exceptions for `ref` as one VibeVoiceError sentence each."""
    from huggingface_hub import errors

    try:
        yield
    except errors.HFValidationError as e:  # an id the Hub would never accept ("--" or ".." in it, a ".git" end)
        raise VibeVoiceError(f"'{ref.repo}' is not a valid Hub repository id ({e})") from None
    except errors.GatedRepoError:
        raise VibeVoiceError(f"{ref.repo}: is a gated repository; accept its conditions on its Hub page and log in "
                             "(`hf auth login`, or set HF_TOKEN)") from None
    except errors.RepositoryNotFoundError:
        raise VibeVoiceError(f"{ref.repo}: no such repository on the Hub, or it is private and no token with access "
                             "was given (`hf auth login`, or set HF_TOKEN); nor is it a local directory") from None
    except errors.RevisionNotFoundError:
        raise VibeVoiceError(f"{ref.repo}: has no revision '{ref.revision}'") from None
    except errors.RemoteEntryNotFoundError:
        raise VibeVoiceError(f"{ref}: has no {what}") from None
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled):
        raise VibeVoiceError(unreachable(ref, what)) from None
    except errors.HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "no"
        raise VibeVoiceError(f"{ref}: fetching its {what} failed: the Hub answered {status}") from None
    except OSError as e:  # a full disk, a cache that cannot be written
        raise VibeVoiceError(f"{ref}: fetching its {what} failed ({e})") from None
    except Exception as e:  # the connection itself: huggingface_hub lets its HTTP client's errors through
        if not type(e).__module__.startswith(("httpx", "httpcore", "h11", "ssl", "socket")):
            raise
        raise HubUnreachable(f"{ref}: the Hub cannot be reached for its {what} ({type(e).__name__}: {e})") from None


def unreachable(ref: HubRef, what: str) -> str:
    why = "HF_HUB_OFFLINE is set" if offline() else "the Hub cannot be reached"
    return (f"{ref}: its {what} is not in the Hugging Face cache and {why}; run once with network to fetch it "
            "(or give a local directory)")


class Snapshot:
    """One commit of a repository: its files' names, and fetching them into the Hugging Face cache.

    Online, the commit and the file list come from the Hub (one API call); offline, from the cache: the commit
    the revision last resolved to, and the files cached for it."""

    def __init__(self, ref: HubRef, commit: str, files: tuple[str, ...]):
        self.ref, self.commit, self.files = ref, commit, files

    @classmethod
    def open(cls, ref: HubRef) -> "Snapshot":
        if offline():
            return cls.cached(ref)
        from huggingface_hub import HfApi

        try:
            with hub_errors(ref, "file list"):
                info = HfApi().model_info(ref.repo, revision=ref.revision)
        except HubUnreachable:
            return cls.cached(ref)  # as huggingface_hub does: the cache serves while the Hub cannot
        return cls(ref, info.sha, tuple(sorted(s.rfilename for s in info.siblings or ())))

    @classmethod
    def cached(cls, ref: HubRef) -> "Snapshot":
        """The snapshot the Hugging Face cache holds for `ref`, without the network."""
        from huggingface_hub import constants

        storage = Path(constants.HF_HUB_CACHE) / f"models--{ref.folder_name}"
        revision = ref.revision or "main"
        commit = revision if _COMMIT.fullmatch(revision) else None
        if commit is None and (storage / "refs" / revision).is_file():
            commit = (storage / "refs" / revision).read_text().strip()
        folder = storage / "snapshots" / commit if commit else None
        if folder is None or not folder.is_dir():
            raise VibeVoiceError(unreachable(ref, "snapshot"))
        files = tuple(sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()))
        return cls(ref, commit, files)

    @property
    def pinned(self) -> HubRef:
        return HubRef(self.ref.repo, self.commit)

    def fetch(self, name: str, what: str | None = None) -> Path:
        """One file of this commit, from the cache or downloaded into it (an interrupted download resumes)."""
        from huggingface_hub import hf_hub_download

        with hub_errors(self.pinned, what or name):
            return Path(hf_hub_download(self.ref.repo, name, revision=self.commit))

    def fetch_all(self, names: list[str], what: str) -> Path:
        """Several files of this commit; returns the snapshot folder that holds them."""
        folder = None
        for name in names:
            path = self.fetch(name, f"{what} ({name})")
            folder = path.parents[len(Path(name).parts) - 1]
        return folder
