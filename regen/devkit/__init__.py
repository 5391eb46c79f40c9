"""The developer kit: simulator, local servers, demo target, the loop, tiny tokenizers, CPU
training, synthetic run dirs. Production never imports it."""
